"""RMSNorm variants: zero-centred (1 + w) and the GDN gated norm (plain w, norm before silu gate)."""

from __future__ import annotations

import torch
from torch import nn

from ninfer.kernels import norm_ref
from ninfer.kernels.dispatch import Ops


class RMSNorm1p(nn.Module):
    """y = (x_f32 * rsqrt(mean(x_f32^2) + eps)) * (1 + w_f32), cast back to x's dtype.

    `ops` (set by the owner or `Qwen35Model.set_ops`) picks the kernels; None = the torch reference."""

    def __init__(self, dim: int, eps: float = 1e-6, ops: Ops | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim]
        fn = norm_ref.rms_norm if self.ops is None else self.ops.rms_norm
        return fn(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual add and norm: (h = x + r, norm(h)); x, r: [..., dim]."""
        fn = norm_ref.add_rms_norm if self.ops is None else self.ops.add_rms_norm
        return fn(x, r, self.weight, self.eps)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Per-head norm then partial rotary: x [B, q, heads, dim] (a view is fine), cos/sin [B, q, rot]."""
        fn = norm_ref.norm_rope if self.ops is None else self.ops.norm_rope
        return fn(x, self.weight, self.eps, cos, sin)


class GatedRMSNorm(nn.Module):
    """GDN output norm per value head: n = norm(x) cast to dtype; y = (w * n) * silu(z_f32), cast to dtype."""

    def __init__(self, dim: int, eps: float = 1e-6, ops: Ops | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.ops = ops

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:  # x, z: [..., dim]
        fn = norm_ref.gated_rms_norm if self.ops is None else self.ops.gated_rms_norm
        return fn(x, z, self.weight, self.eps)
