"""Which captured steps launch their kernels with programmatic dependent launch (PDL).

The engine captures each decode / verify / draft step under `pdl_allowed(for_step(rows, q))`;
the Triton launch sites read `pdl_permitted()` (see `ninfer.kernels.triton.pdl`). Kept free of
Triton so the engine imports it on any machine. Measured on the H200 (whole decode steps as CUDA
graphs): PDL made batch-8 steps 0.36-0.44 ms faster (27B 16.22 -> 15.86 ms, 35B-A3B 7.69 ->
7.25 ms) and batch-1 steps slower (27B 14.25 -> 14.86 ms, 35B-A3B 3.49 -> 3.74 ms), so a
single-token step (the one-row GEMV on the CUDA cores) launches without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_SCOPE: list[bool] = []  # innermost last; kernels launch on the engine thread only


@contextmanager
def pdl_allowed(on: bool) -> Iterator[None]:
    """Launches inside the block may use PDL only if `on`."""
    _SCOPE.append(on)
    try:
        yield
    finally:
        _SCOPE.pop()


def pdl_permitted() -> bool:
    """False inside an enclosing `pdl_allowed(False)`."""
    return not _SCOPE or _SCOPE[-1]


def for_step(rows: int, q: int) -> bool:
    """Whether a captured step of `rows` x `q` tokens launches with PDL: two tokens or more."""
    return rows * q > 1
