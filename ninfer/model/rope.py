"""Partial rotary embedding with interleaved MRoPE (three position streams), default or YaRN frequencies."""

from __future__ import annotations

import math

import torch
from torch import nn

from ninfer.model.config import TextConfig


def _yarn_inv_freq(config: TextConfig, base: float, dim: int) -> tuple[torch.Tensor, float]:
    """YaRN inverse frequencies and attention scaling (the transformers `yarn` rope type)."""
    p = dict(config.rope_scaling or {})
    factor = p.get("factor")
    orig = p.get("original_max_position_embeddings")
    if orig is None:
        raise ValueError("yarn rope_scaling needs original_max_position_embeddings")
    if factor is None:
        factor = config.max_position_embeddings / orig
    factor = float(factor)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = p.get("attention_factor")
    if attn is None:
        ms, ms_all = p.get("mscale"), p.get("mscale_all_dim")
        attn = mscale(factor, ms) / mscale(factor, ms_all) if ms and ms_all else mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def corr_dim(rot: float) -> float:
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrap = 1 - ramp  # weight of the unscaled frequency
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
    return inv, float(attn)


def rope_frequencies(config: TextConfig) -> tuple[torch.Tensor, float]:
    """inv_freq [rotary_dim/2] fp32 and the cos/sin scaling for the config's rope type."""
    dim = config.rotary_dim
    rope_type = (config.rope_scaling or {}).get(
        "rope_type", (config.rope_scaling or {}).get("type", "default")
    )
    if rope_type in (None, "default"):
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        return inv, 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(config, config.rope_theta, dim)
    raise ValueError(f"unsupported rope type {rope_type!r}; supported: 'default', 'yarn'")


def mrope_axis(config: TextConfig) -> torch.Tensor:
    """Position stream (0 T, 1 H, 2 W) of each of the rotary_dim/2 frequencies. -> [rotary_dim/2] int64"""
    half = config.rotary_dim // 2
    axis = torch.zeros(half, dtype=torch.int64)
    sec = config.mrope_section
    if not config.mrope_interleaved:
        raise ValueError("only interleaved MRoPE is supported (the Qwen3.5 text rotary always interleaves)")
    for j in range(half):
        if j % 3 == 1 and j < 3 * sec[1]:
            axis[j] = 1
        elif j % 3 == 2 and j < 3 * sec[2]:
            axis[j] = 2
    return axis


class MRotaryEmbedding(nn.Module):
    """cos/sin [B, q, rotary_dim] (model dtype) from positions [3, B, q]."""

    def __init__(self, config: TextConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        inv, self.scaling = rope_frequencies(config)
        self.register_buffer("inv_freq", inv.to(device), persistent=False)
        self.register_buffer("axis", mrope_axis(config).to(device), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq  # [3, B, q, half]
        idx = self.axis.view(1, 1, 1, -1).expand(1, *freqs.shape[1:])
        f = torch.gather(freqs, 0, idx)[0]  # [B, q, half]: frequency j from stream axis[j]
        cos = f.cos() * self.scaling
        sin = f.sin() * self.scaling
        return torch.cat([cos, cos], -1).to(dtype), torch.cat([sin, sin], -1).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary_dim dims of every head (NeoX halves); x: [B, q, heads, hd], cos/sin: [B, q, rot]."""
    rot = cos.shape[-1]
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    xr, xp = x[..., :rot], x[..., rot:]
    return torch.cat([xr * c + _rotate_half(xr) * s, xp], dim=-1)
