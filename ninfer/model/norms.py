"""RMSNorm variants: zero-centred (1 + w) and the GDN gated norm (plain w, norm before silu gate)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm1p(nn.Module):
    """y = (x_f32 * rsqrt(mean(x_f32^2) + eps)) * (1 + w_f32), cast back to x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim]
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """GDN output norm per value head: n = norm(x) cast to dtype; y = (w * n) * silu(z_f32), cast to dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:  # x, z: [..., dim]
        dtype = x.dtype
        xf = x.float()
        n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)
        y = self.weight * n  # product in the parameter/activation dtype
        return (y * F.silu(z.float())).to(dtype)
