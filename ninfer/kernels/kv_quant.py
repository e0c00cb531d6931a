"""Symmetric per-token per-head int8 KV quantisation (torch ops, CPU and GPU, no device sync)."""

from __future__ import annotations

import torch


def quantize_kv_int8(
    x: torch.Tensor, scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., hd] (keys or values of one token and head per row).

    returns (xq [..., hd] int8, scale [...] in scale_dtype) with x ≈ xq · scale, scale = amax|x| / 127
    (rounded to scale_dtype first, so the stored scale is the one used); all-zero rows get scale 0.
    """
    xf = x.float()
    scale = (xf.abs().amax(-1) / 127.0).to(scale_dtype)  # [...]
    s = scale.float().unsqueeze(-1)
    xq = torch.where(s > 0, xf / torch.where(s > 0, s, 1.0), 0.0).round().clamp(-127, 127).to(torch.int8)
    return xq, scale


def dequantize_kv_int8(xq: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """xq: [..., hd] int8, scale: [...] -> xq · scale in `dtype` (product taken in fp32)."""
    return (xq.float() * scale.float().unsqueeze(-1)).to(dtype)
