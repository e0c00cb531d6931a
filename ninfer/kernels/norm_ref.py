"""Torch reference of the norm ops (1+w RMSNorm, residual add + norm, GDN gated norm, q/k norm + rope)
and the small gated products around them; the model's torch code, and the oracle of the fused kernels."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.formats import QuantWeight
from ninfer.kernels import quant_ref


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = (x_f32 * rsqrt(mean(x_f32^2) + eps)) * (1 + w_f32), cast to x's dtype. x: [..., D]; w: [D]."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + weight.float())).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + r (x's dtype), y = rms_norm(h). -> (h, y), both [..., D]."""
    h = x + r
    return h, rms_norm(h, weight, eps)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm: n = norm(x) cast to x's dtype; y = (w * n) * silu(z_f32), cast. x, z: [..., D]."""
    dtype = x.dtype
    xf = x.float()
    n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    y = weight * n  # product in the parameter/activation dtype
    return (y * F.silu(z.float())).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def norm_rope(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """Per-head 1+w RMSNorm, then NeoX rotary on the first rot dims (`ninfer.model.rope.apply_rope`).

    x: [B, q, heads, hd] (any strides, last dim contiguous); cos, sin: [B, q, rot]. -> [B, q, heads, hd]
    """
    y = rms_norm(x, weight, eps)
    rot = cos.shape[-1]
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    yr, yp = y[..., :rot], y[..., rot:]
    return torch.cat([yr * c + _rotate_half(yr) * s, yp], dim=-1)


def sigmoid_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Attention output gate: o [B, q, nh, hd] * sigmoid(gate [B, q, nh, hd] view) -> [B, q, nh*hd]."""
    b, q = o.shape[:2]
    return o.reshape(b, q, -1) * torch.sigmoid(gate.reshape(b, q, -1))


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation silu(gate) * up (each rounded to the activation dtype, as torch does)."""
    return F.silu(gate) * up


def swiglu_linear(gate_up: torch.Tensor, weight: torch.Tensor | QuantWeight) -> torch.Tensor:
    """MLP activation + down projection on the fused gate | up output:
    silu_mul(gate_up[..., :K], gate_up[..., K:]) @ weight.T. gate_up: [..., 2K]; weight: [N, K]. -> [..., N]"""
    k = weight.shape[-1]
    if gate_up.shape[-1] != 2 * k:
        raise ValueError(f"gate_up {tuple(gate_up.shape)} is not gate | up for weight {tuple(weight.shape)}")
    return F.linear(silu_mul(gate_up[..., :k], gate_up[..., k:]), quant_ref.dense(weight, gate_up.dtype))


def shared_expert_add(routed: torch.Tensor, gate_logit: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """MoE output: routed [N, H] + sigmoid(gate_logit [N, 1]) * shared [N, H]."""
    return routed + torch.sigmoid(gate_logit) * shared
