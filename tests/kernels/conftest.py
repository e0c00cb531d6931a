"""Kernel tests run Triton programs on the CPU interpreter unless TRITON_INTERPRET=0 (then on CUDA).

Triton 3.6's interpreter has three defects that the compiled kernels do not have; they are patched
(`ninfer.kernels.triton.interpreter_fixes`) so the interpreter computes what the GPU computes.
"""

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

try:
    from ninfer.kernels.triton.interpreter_fixes import patch_interpreter
except ImportError:  # triton missing: the test modules skip with a reason
    pass
else:
    patch_interpreter()


@pytest.fixture
def interpreted_whole_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole-model runs on the interpreter, which pays per program: the GEMV is off (interpreting it
    for every projection costs minutes) and each MoE expert GEMM runs one tile per expert. The GEMV
    and the MoE tiling have their own tests (test_gemv.py, test_triton_moe.py); compiled on a GPU
    (TRITON_INTERPRET=0) everything runs as the engine runs it."""
    if os.environ["TRITON_INTERPRET"] == "0":
        return
    import triton

    from ninfer.kernels.triton import gemv, moe

    monkeypatch.setattr(gemv, "INTERPRETER_DISPATCH", False)
    pick = moe.pick_config

    def one_tile(
        n: int, k: int, e: int, h: int, ie: int, block_n: int | None = None, block_k: int | None = None,
        *, elem_size: int = 2,
    ) -> moe.SmallConfig:  # fmt: skip
        wide = block_n or triton.next_power_of_2(max(h, ie))
        return pick(n, k, e, h, ie, wide, block_k, elem_size=elem_size)

    monkeypatch.setattr(moe, "pick_config", one_tile)
