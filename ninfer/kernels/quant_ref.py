"""Torch references over quantized weights: dequantize (the format's fp32 reconstruction, then the
activation dtype) and run the dense op. On the CPU in fp32 this is exactly the dense model on the
dequantized weights (what transformers is compared against)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.formats import QuantWeight


def dense(w: torch.Tensor | QuantWeight, dtype: torch.dtype) -> torch.Tensor:
    """A weight as a dense tensor of `dtype` (a dense one as it is)."""
    return w.dequantize(dtype) if isinstance(w, QuantWeight) else w


def qlinear(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """x [..., K] @ dequant(w) [N, K]^T -> [..., N] in x's dtype."""
    return F.linear(x, w.dequantize(x.dtype))


def expert(w: torch.Tensor | QuantWeight, e: int, dtype: torch.dtype) -> torch.Tensor:
    """Expert e's matrix of a bank [E, N, K] -> [N, K] dense."""
    return w.expert(e).dequantize(dtype) if isinstance(w, QuantWeight) else w[e]


def reserve_nothing(weights: list[QuantWeight], dtype: torch.dtype) -> None:
    """`Ops.reserve_quantized` of the reference: it dequantizes into fresh tensors."""
