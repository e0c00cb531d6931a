"""Fixes for three Triton 3.6 interpreter defects, so TRITON_INTERPRET=1 computes what the GPU computes,
and one for its speed.

Used by the CPU kernel tests and the CPU kernel counter only (never on the GPU path):
* scalars become Python ints via int() of a 1-element array, which numpy >= 2.4 rejects (loops
  with a runtime bound fail);
* bf16 values are kept as raw uint16 bits and tl.dot multiplies those bits;
* casts to and from bf16 truncate (the GPU rounds to nearest even) or reinterpret integer values.

Speed: every call of a @triton.jit helper inside a kernel re-patches triton.language (about 1.7 ms
a call, a fifth of a whole-model interpreter run), although the kernel's launch has already patched
the same module objects for its whole grid; helper calls inside a launch skip that.
"""

from __future__ import annotations

from types import ModuleType


def patch_interpreter() -> None:
    """Apply the three fixes and the speed-up (idempotent); a no-op when triton or numpy is missing."""
    try:
        import numpy as np
        import torch
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # the test modules skip with a reason
        return
    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_ninfer_patched", False):
        return
    torch_dtypes = {
        tl.float32: torch.float32,
        tl.float16: torch.float16,
        tl.bfloat16: torch.bfloat16,
        tl.float64: torch.float64,
        tl.int8: torch.int8,
        tl.int16: torch.int16,
        tl.int32: torch.int32,
        tl.int64: torch.int64,
    }

    def as_torch(handle) -> torch.Tensor:
        data = np.ascontiguousarray(handle.data)
        if handle.dtype.scalar == tl.bfloat16:
            return torch.from_numpy(data.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(data.copy())

    def from_torch(x: torch.Tensor, dtype) -> interpreter.TensorHandle:
        if x.dtype == torch.bfloat16:
            return interpreter.TensorHandle(x.view(torch.int16).numpy().view(np.uint16), dtype)
        return interpreter.TensorHandle(x.numpy(), dtype)

    original_cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        if tl.bfloat16 in (src_ty, dst_ty) and src_ty in torch_dtypes and dst_ty in torch_dtypes:
            return from_torch(as_torch(src).to(torch_dtypes[dst_ty]), dst_ty)
        return original_cast(self, src, dst_type)

    original_dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widen(h):  # bf16 -> fp32 is exact, as in the tensor cores' fp32 accumulation
            if h.dtype.scalar == tl.bfloat16:
                return interpreter.TensorHandle(as_torch(h).float().numpy(), tl.float32)
            return h

        return original_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    builder.cast_impl = cast_impl
    for name in ("create_fp_ext", "create_fp_trunc", "create_si_to_fp", "create_fp_to_si"):
        setattr(builder, name, lambda self, src, dst_type: self.cast_impl(src, dst_type))
    builder.create_dot = create_dot

    original_patch = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope) -> None:
        original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor
    _skip_repatching_in_launches(interpreter)
    builder._ninfer_patched = True


def _skip_repatching_in_launches(interpreter: ModuleType) -> None:
    """Inside a launch, a device function whose triton.language modules the launch (or an earlier
    helper) has already patched is not patched again; the launch's own restore still undoes all."""
    import inspect

    import triton.language as tl

    patched: set[int] = set()  # ids of the language modules patched in the running launch
    original_launch = interpreter.GridExecutor.__call__
    original_patch_lang = interpreter._patch_lang

    def launch(self, *args, **kwargs):
        patched.clear()
        try:
            return original_launch(self, *args, **kwargs)
        finally:
            patched.clear()

    def patch_lang(fn):
        langs = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}
        if patched and langs <= patched:
            return None  # only device-function calls get here; they drop the scope unused
        scope = original_patch_lang(fn)
        patched.update(langs)
        return scope

    interpreter.GridExecutor.__call__ = launch
    interpreter._patch_lang = patch_lang
