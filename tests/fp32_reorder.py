"""Tolerances for fp32 results that may differ only in the order of their reductions.

Summing k fp32 terms in another order (another thread count, another BLAS blocking, a fused GEMM
with a wider output, a batch of another size) changes the result by at most about
k * eps * sum(|terms|) (Higham's gamma_k bound for recursive summation). The tests using this
compare normalized activations, logits and states whose term sums are of the order of the
result's own magnitude, so the bound is k * eps relative to the reference's largest magnitude,
with k the longest reduction feeding the result. A fixed tolerance such as atol=1e-5 is instead
tuned to one machine's summation order, and fails on another's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

FP32_EPS = torch.finfo(torch.float32).eps


def reorder_tolerance(reference: torch.Tensor, k: int) -> dict[str, float]:
    """`assert_close` / `allclose` keywords bounding a reordering of k-term fp32 reductions."""
    bound = k * FP32_EPS
    return {"rtol": bound, "atol": bound * float(reference.detach().abs().max())}


def longest_reduction(module: torch.nn.Module, *extra: int) -> int:
    """The longest reduction a module's GEMMs run: the largest input width (a weight's last
    dimension) over its matrices, or any longer reduction the caller names (attention keys)."""
    widths: Iterable[int] = (p.shape[-1] for p in module.parameters() if p.dim() >= 2)
    return max([*widths, *extra])
