"""Kernel tests run Triton programs on the CPU interpreter unless TRITON_INTERPRET=0 (then on CUDA).

Triton 3.6's interpreter has three defects that the compiled kernels do not have; they are patched
(`ninfer.kernels.triton.interpreter_fixes`) so the interpreter computes what the GPU computes.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

try:
    from ninfer.kernels.triton.interpreter_fixes import patch_interpreter
except ImportError:  # triton missing: the test modules skip with a reason
    pass
else:
    patch_interpreter()
