"""Kernel tests run Triton programs on the CPU interpreter unless TRITON_INTERPRET=0 (then on CUDA)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported


def _fix_interpreter_scalar_index() -> None:
    """Triton 3.6's interpreter turns a scalar into a Python int with `int(array_of_shape_(1,))`, which
    numpy >= 2.4 rejects (loops with a runtime bound fail); later Triton releases squeeze first."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # the test modules skip with a reason
        return
    original = interpreter._patch_lang_tensor
    if getattr(original, "_ninfer_fixed", False):
        return

    def patch(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch._ninfer_fixed = True
    interpreter._patch_lang_tensor = patch


_fix_interpreter_scalar_index()
