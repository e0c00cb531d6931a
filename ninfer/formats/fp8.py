"""Block-scaled FP8 (Qwen's FP8 checkpoints): e4m3fn codes [R, K] with one fp32 scale per 128 x 128
block, [ceil(R / 128), ceil(K / 128)]; dequantized weight = fp32(code) * scale of its block (the
checkpoints' `weight_scale_inv`).

Our encoder (for `--weights fp8` from a bf16 checkpoint): per block scale = amax / 448 (1 for an
all-zero block), code = e4m3fn(clamp(x / scale, -448, 448)) rounded to nearest even by torch's cast.
"""

from __future__ import annotations

import torch

from ninfer.formats.registry import FP8_BLOCK, FP8_MAX

FP8_DTYPE = torch.float8_e4m3fn


def _blocks(n: int) -> int:
    return -(-n // FP8_BLOCK)


def expand(scale: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """Block scales [ceil(R/128), ceil(K/128)] -> one per element [rows, k] (fp32)."""
    s = scale.to(torch.float32).repeat_interleave(FP8_BLOCK, dim=0)[:rows]
    return s.repeat_interleave(FP8_BLOCK, dim=1)[:, :k]


def encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, K] -> (codes e4m3fn [R, K], scales fp32 [ceil(R/128), ceil(K/128)])."""
    if x.dim() != 2:
        raise ValueError(f"fp8 encoding takes an [R, K] matrix; got {tuple(x.shape)}")
    x32 = x.to(torch.float32)
    if not bool(torch.isfinite(x32).all()):
        raise ValueError("cannot quantize non-finite values (NaN or infinity)")
    r, k = x32.shape
    rb, kb = _blocks(r), _blocks(k)
    padded = torch.nn.functional.pad(x32, (0, kb * FP8_BLOCK - k, 0, rb * FP8_BLOCK - r))
    amax = padded.view(rb, FP8_BLOCK, kb, FP8_BLOCK).abs().amax(dim=(1, 3))  # [rb, kb]
    scale = torch.where(amax > 0, amax / FP8_MAX, 1.0)
    q = (x32 / expand(scale, r, k)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """codes [R, K] e4m3fn, block scales -> fp32 [R, K]."""
    r, k = codes.shape
    return codes.to(torch.float32) * expand(scale, r, k)
