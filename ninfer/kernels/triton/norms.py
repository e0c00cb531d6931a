"""Fused RMSNorm kernels (Triton): 1+w norm with optional residual add, GDN gated norm, q/k norm + rope.

Rows are addressed as [outer, inner] with two strides each, so per-head views of a fused
projection (the query half of [q | gate], strided heads) are read in place; only the last dim
must be contiguous. Roundings follow `ninfer.kernels.norm_ref` (the model's torch code): every
intermediate the torch code stores in the activation dtype is rounded to it here too. Kernels that
add rounded products compile without FMA contraction (`enable_fp_fusion=False`): the GPU compiler
otherwise fuses the multiply of two bf16 values with the following add and skips the rounding in
between (measured on the H200: 7 % of norm_rope outputs 1 ulp off torch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton import pdl
from ninfer.kernels.triton._checks import check_devices
from ninfer.kernels.triton.pdl import pdl_enter

_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _rms_kernel(
    x_ptr, r_ptr, h_ptr, w_ptr, y_ptr,  # rows [outer, inner, D]
    INNER, D, eps,
    sx0, sx1, sr0, sr1, sh0, sh1, sy0, sy1,
    BD: tl.constexpr,
    HAS_RES: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    o, i = row // INNER, row % INNER
    offs = tl.arange(0, BD)
    mask = offs < D
    x = tl.load(x_ptr + o * sx0 + i * sx1 + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + o * sr0 + i * sr1 + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)  # h in the activation dtype
        tl.store(h_ptr + o * sh0 + i * sh1 + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = xf * rstd * (1.0 + w)
    tl.store(y_ptr + o * sy0 + i * sy1 + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_kernel(
    x_ptr, z_ptr, w_ptr, y_ptr,
    INNER, D, eps,
    sx0, sx1, sz0, sz1, sy0, sy1,
    BD: tl.constexpr,
    PROD: tl.constexpr,  # dtype of w * n (torch promotion of the weight and activation dtypes)
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    o, i = row // INNER, row % INNER
    offs = tl.arange(0, BD)
    mask = offs < D
    x = tl.load(x_ptr + o * sx0 + i * sx1 + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    n = (x * rstd).to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    wn = (w * n).to(PROD).to(tl.float32)
    z = tl.load(z_ptr + o * sz0 + i * sz1 + offs, mask=mask, other=0.0).to(tl.float32)
    y = wn * (z * tl.sigmoid(z))
    tl.store(y_ptr + o * sy0 + i * sy1 + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr,  # x, y rows [tokens, heads, D]; cos, sin [tokens, ROT]
    INNER, D, eps,
    sx0, sx1, sc0, sy0, sy1,
    BD: tl.constexpr,
    ROT: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    o, i = row // INNER, row % INNER
    offs = tl.arange(0, BD)
    mask = offs < D
    dt = y_ptr.dtype.element_ty
    x_row = x_ptr + o * sx0 + i * sx1
    x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = (x * rstd * (1.0 + w)).to(dt).to(tl.float32)  # the normed head, rounded as torch stores it
    # rotate_half partner of each rotary dim, normed elementwise with the same rstd
    in_rot = offs < ROT
    partner = tl.where(offs < ROT // 2, offs + ROT // 2, offs - ROT // 2)
    xp = tl.load(x_row + partner, mask=in_rot, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=in_rot, other=0.0).to(tl.float32)
    yp = (xp * rstd * (1.0 + wp)).to(dt).to(tl.float32)
    yp = tl.where(offs < ROT // 2, -yp, yp)
    c = tl.load(cos_ptr + o * sc0 + offs, mask=in_rot, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + o * sc0 + offs, mask=in_rot, other=0.0).to(tl.float32)
    rot = (y * c).to(dt).to(tl.float32) + (yp * s).to(dt).to(tl.float32)
    out = tl.where(in_rot, rot, y)
    tl.store(y_ptr + o * sy0 + i * sy1 + offs, out.to(dt), mask=mask)


def _rows(x: torch.Tensor, name: str) -> torch.Tensor:
    """[..., D] -> a [outer, inner, D] view (inner = dim -2 for >= 3-D inputs); raises if not viewable."""
    if x.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim (stride {x.stride()})")
    d = x.shape[-1]
    inner = x.shape[-2] if x.dim() >= 3 else 1
    try:
        return x.view(-1, inner, d)
    except RuntimeError as err:
        raise ValueError(f"{name} {tuple(x.shape)} / {x.stride()}: leading dims must merge into one") from err


def _check_weight(weight: torch.Tensor, d: int) -> None:
    if weight.shape != (d,) or weight.stride(0) != 1:
        raise ValueError(f"weight must be a contiguous [D={d}]; got {tuple(weight.shape)}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`norm_ref.rms_norm` in one launch. x: [..., D] (views fine, see module doc). -> contiguous [..., D]."""
    xv = _rows(x, "x")
    _check_weight(weight, x.shape[-1])
    check_devices(x, weight)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    yv = y.view(xv.shape)
    n = xv.shape[0] * xv.shape[1]
    if n:
        _rms_kernel[(n,)](
            xv, xv, xv, weight, yv, xv.shape[1], xv.shape[2], eps,
            xv.stride(0), xv.stride(1), 0, 0, 0, 0, yv.stride(0), yv.stride(1),
            BD=triton.next_power_of_2(xv.shape[2]), HAS_RES=False, num_warps=_warps(xv.shape[2]),
            **pdl.launch(x),
        )  # fmt: skip
    return y


def add_rms_norm(
    x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`norm_ref.add_rms_norm` in one launch: (h = x + r, rms_norm(h)). x, r: [..., D] same shape."""
    if r.shape != x.shape or r.dtype != x.dtype:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} and r {tuple(r.shape)} {r.dtype} must match")
    xv, rv = _rows(x, "x"), _rows(r, "r")
    _check_weight(weight, x.shape[-1])
    check_devices(x, r, weight)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y = torch.empty_like(h)
    hv, yv = h.view(xv.shape), y.view(xv.shape)
    n = xv.shape[0] * xv.shape[1]
    if n:
        _rms_kernel[(n,)](
            xv, rv, hv, weight, yv, xv.shape[1], xv.shape[2], eps,
            xv.stride(0), xv.stride(1), rv.stride(0), rv.stride(1),
            hv.stride(0), hv.stride(1), yv.stride(0), yv.stride(1),
            BD=triton.next_power_of_2(xv.shape[2]), HAS_RES=True, num_warps=_warps(xv.shape[2]),
            **pdl.launch(x),
        )  # fmt: skip
    return h, y


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`norm_ref.gated_rms_norm` in one launch. x, z: [..., D] same shape (views fine). -> [..., D]."""
    if z.shape != x.shape:
        raise ValueError(f"x {tuple(x.shape)} and z {tuple(z.shape)} must have one shape")
    xv, zv = _rows(x, "x"), _rows(z, "z")
    _check_weight(weight, x.shape[-1])
    check_devices(x, z, weight)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    yv = y.view(xv.shape)
    prod = _TL[torch.promote_types(weight.dtype, x.dtype)]
    n = xv.shape[0] * xv.shape[1]
    if n:
        _gated_kernel[(n,)](
            xv, zv, weight, yv, xv.shape[1], xv.shape[2], eps,
            xv.stride(0), xv.stride(1), zv.stride(0), zv.stride(1), yv.stride(0), yv.stride(1),
            BD=triton.next_power_of_2(xv.shape[2]), PROD=prod, num_warps=_warps(xv.shape[2]),
            **pdl.launch(x),
        )  # fmt: skip
    return y


def norm_rope(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """`norm_ref.norm_rope` in one launch. x: [B, q, heads, hd] view; cos, sin: [B, q, rot]. -> contiguous."""
    if x.dim() != 4 or cos.shape != (*x.shape[:2], cos.shape[-1]) or sin.shape != cos.shape:
        raise ValueError(f"x must be [B, q, heads, hd], cos/sin [B, q, rot]; got {x.shape}, {cos.shape}")
    rot = cos.shape[-1]
    if rot % 2 or rot > x.shape[-1]:
        raise ValueError(f"rotary dims {rot} must be even and <= head_dim {x.shape[-1]}")
    xv = _rows(x, "x")
    cv, sv = cos.reshape(-1, rot), sin.reshape(-1, rot)
    if cv.stride() != sv.stride() or cv.stride(-1) != 1:
        raise ValueError("cos and sin must share strides with a contiguous last dim")
    _check_weight(weight, x.shape[-1])
    check_devices(x, weight, cos, sin)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    yv = y.view(xv.shape)
    n = xv.shape[0] * xv.shape[1]
    if n:
        _norm_rope_kernel[(n,)](
            xv, weight, cv, sv, yv, xv.shape[1], xv.shape[2], eps,
            xv.stride(0), xv.stride(1), cv.stride(0), yv.stride(0), yv.stride(1),
            BD=triton.next_power_of_2(xv.shape[2]), ROT=rot, num_warps=_warps(xv.shape[2]), enable_fp_fusion=False,
            **pdl.launch(x),
        )  # fmt: skip
    return y


def _warps(d: int) -> int:
    return 1 if d <= 256 else 4 if d <= 2048 else 8
