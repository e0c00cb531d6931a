"""Fused gated-delta-rule decode / verify step over a slot-indexed fp32 state pool (Triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton import pdl
from ninfer.kernels.triton._checks import check_devices, check_int_index, last_dim_contiguous
from ninfer.kernels.triton.pdl import pdl_enter


@triton.jit
def _gdn_step_kernel(
    q_ptr,  # [N, T, nk, dk]
    k_ptr,  # [N, T, nk, dk]
    v_ptr,  # [N, T, nv, dv]
    a_ptr,  # [N, T, nv]  raw gate projection (FUSED_GATING) or g = log decay
    b_ptr,  # [N, T, nv]  raw beta projection (FUSED_GATING) or beta
    a_log_ptr,  # [nv] fp32
    dt_bias_ptr,  # [nv] fp32
    ssm_ptr,  # [num_slots, nv, dk, dv], last dim contiguous
    slot_ptr,  # [N, T] int: slot that receives the state after token t (< 0: no write)
    start_ptr,  # [N] int: slot the initial state is read from (< 0: padding row)
    o_ptr,  # [N, T, nv, dv]
    T,
    scale,
    s_qn, s_qt, s_qh,
    s_kn, s_kt, s_kh,
    s_vn, s_vt, s_vh,
    s_an, s_at,
    s_bn, s_bt,
    s_ss, s_sh, s_sk,
    s_in, s_it,
    s_on, s_ot, s_oh,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GROUP: tl.constexpr,
    FUSED_GATING: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    vb = tl.program_id(2)
    hk = h // GROUP  # value head h reads key/query head h // (nv / nk)

    offs_k = tl.arange(0, BK)
    offs_v = vb * BV + tl.arange(0, BV)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    mask_kv = mask_k[:, None] & mask_v[None, :]
    tile = offs_k[:, None] * s_sk + offs_v[None, :]  # [BK, BV] offsets inside one (slot, head)

    start = tl.load(start_ptr + n).to(tl.int64)
    valid = start >= 0
    state = tl.load(
        ssm_ptr + tl.maximum(start, 0) * s_ss + h * s_sh + tile, mask=mask_kv & valid, other=0.0
    ).to(tl.float32)  # [BK, BV]

    if FUSED_GATING:
        neg_a = -tl.exp(tl.load(a_log_ptr + h).to(tl.float32))
        dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)

    for t in range(0, T):
        q = tl.load(q_ptr + n * s_qn + t * s_qt + hk * s_qh + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + n * s_kn + t * s_kt + hk * s_kh + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + n * s_vn + t * s_vt + h * s_vh + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + n * s_an + t * s_at + h).to(tl.float32)
        b = tl.load(b_ptr + n * s_bn + t * s_bt + h).to(tl.float32)
        if FUSED_GATING:
            x = a + dt_bias
            # softplus with torch's threshold 20, in the overflow-free form
            softplus = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))))
            decay = tl.exp(neg_a * softplus)
            beta = tl.sigmoid(b)
        else:
            decay = tl.exp(a)
            beta = b
        # l2 norm with the eps inside the sum (FLA / transformers convention), then dk^-0.5 on q
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)

        state = state * decay
        pred = tl.sum(state * k[:, None], axis=0)  # [BV] what the state predicts for k
        state = state + k[:, None] * ((v - pred) * beta)[None, :]
        o = tl.sum(state * q[:, None], axis=0)  # [BV] read after the write
        o = tl.where(valid, o, 0.0)
        tl.store(o_ptr + n * s_on + t * s_ot + h * s_oh + offs_v, o.to(o_ptr.dtype.element_ty), mask=mask_v)

        slot = tl.load(slot_ptr + n * s_in + t * s_it).to(tl.int64)
        tl.store(
            ssm_ptr + tl.maximum(slot, 0) * s_ss + h * s_sh + tile,
            state.to(ssm_ptr.dtype.element_ty),
            mask=mask_kv & valid & (slot >= 0),
        )


def gdn_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm: torch.Tensor,
    slot_idx: torch.Tensor,
    start_slot: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """One GDN recurrence step (T tokens per sequence) with fused gating, state read/written by slot.

    q, k: [N, T, nk, dk]; v: [N, T, nv, dv]; a, b: [N, T, nv] raw projections (activation dtype);
    A_log, dt_bias: [nv] (fp32); ssm: [num_slots, nv, dk, dv] state pool (fp32), updated in place;
    slot_idx: [N, T] int, slot that receives the state after token t (< 0: not written);
    start_slot: [N] int, slot the initial state is read from (default slot_idx[:, 0]); a row with
    start_slot < 0 is padding: no read, no write, output zeros.
    Computes g = -exp(A_log)·softplus(a + dt_bias), beta = sigmoid(b), l2-normalised q·dk^-0.5 and
    k, then per token: S ← e^g S; S ← S + k ⊗ beta (v − Sᵀk); o = Sᵀq.
    block_v / num_warps: the state tile is dk x block_v per program; by default 16 / 2 when few
    programs would run (N·nv < 256), else 32 / 4 (measured best on an H200, see README).
    returns o: [N, T, nv, dv] in v's dtype (written into `out` when given).
    """
    _check_step(q, k, v, a, b, ssm, slot_idx)
    check_devices(q, A_log, dt_bias)
    if A_log.shape != (v.shape[2],) or dt_bias.shape != (v.shape[2],):
        raise ValueError(
            f"A_log {tuple(A_log.shape)} / dt_bias {tuple(dt_bias.shape)} must be [nv={v.shape[2]}]"
        )
    return _launch(
        q, k, v, a, b, A_log, dt_bias, ssm, slot_idx, start_slot, scale, out, block_v, num_warps, True
    )


def gdn_step_gated(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm: torch.Tensor,
    slot_idx: torch.Tensor,
    start_slot: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """`gdn_decode_step` with precomputed gates: g (log decay, ≤ 0) and beta (post-sigmoid), [N, T, nv]."""
    _check_step(q, k, v, g, beta, ssm, slot_idx)
    return _launch(q, k, v, g, beta, g, g, ssm, slot_idx, start_slot, scale, out, block_v, num_warps, False)


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for `ninfer.kernels.gdn_ref.recurrent_gated_delta_rule` (contiguous states, no slots).

    q, k: [B, T, nk, dk]; v: [B, T, nv, dv]; g, beta: [B, T, nv]; initial_state: [B, nv, dk, dv] or None.
    returns o: [B, T, nv, dv] in v's dtype, final_state: [B, nv, dk, dv] float32 (a new tensor).
    """
    bsz, t, nv, dv = v.shape
    dk = k.shape[-1]
    if initial_state is None:
        state = torch.zeros(bsz, nv, dk, dv, dtype=torch.float32, device=v.device)
    else:
        state = initial_state.to(torch.float32, copy=True)
    rows = torch.arange(bsz, dtype=torch.int32, device=v.device)
    slot_idx = torch.full((bsz, t), -1, dtype=torch.int32, device=v.device)
    slot_idx[:, -1] = rows  # only the final state is kept
    o = gdn_step_gated(q, k, v, g, beta, state, slot_idx, rows)
    return o, state


def _check_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    ssm: torch.Tensor,
    slot_idx: torch.Tensor,
) -> None:
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"q, k must be [N, T, nk, dk] and v [N, T, nv, dv]; got {q.shape}, {k.shape}, {v.shape}"
        )
    n, t, nk, dk = q.shape
    nv, dv = v.shape[2], v.shape[3]
    if nv % nk:
        raise ValueError(f"value heads ({nv}) must be a multiple of key heads ({nk})")
    if a.shape != (n, t, nv) or b.shape != (n, t, nv):
        raise ValueError(f"gates must be [N, T, nv] = {(n, t, nv)}; got {tuple(a.shape)}, {tuple(b.shape)}")
    if ssm.dim() != 4 or ssm.shape[1:] != (nv, dk, dv):
        raise ValueError(f"ssm pool must be [num_slots, {nv}, {dk}, {dv}]; got {tuple(ssm.shape)}")
    if slot_idx.shape != (n, t):
        raise ValueError(f"slot_idx must be [N, T] = {(n, t)}; got {tuple(slot_idx.shape)}")
    check_int_index("slot_idx", slot_idx)
    check_devices(q, k, v, a, b, ssm, slot_idx)
    last_dim_contiguous(q=q, k=k, v=v, a=a, b=b)
    if ssm.stride(3) != 1 or ssm.stride(2) != dv:
        raise ValueError("ssm pool must be contiguous in its last two dims [dk, dv]")


def _launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm: torch.Tensor,
    slot_idx: torch.Tensor,
    start_slot: torch.Tensor | None,
    scale: float | None,
    out: torch.Tensor | None,
    block_v: int | None,
    num_warps: int | None,
    fused_gating: bool,
) -> torch.Tensor:
    n, t, nk, dk = q.shape
    nv, dv = v.shape[2], v.shape[3]
    if start_slot is None:
        start_slot = slot_idx[:, 0]
    if start_slot.shape != (n,):
        raise ValueError(f"start_slot must be [N] = {(n,)}; got {tuple(start_slot.shape)}")
    check_int_index("start_slot", start_slot)
    if out is None:
        out = torch.empty(n, t, nv, dv, dtype=v.dtype, device=v.device)
    elif out.shape != (n, t, nv, dv) or out.stride(3) != 1:
        raise ValueError(f"out must be [N, T, nv, dv] = {(n, t, nv, dv)} with a contiguous last dim")
    if n == 0 or t == 0:
        return out
    if block_v is None:
        block_v = 16 if n * nv < 256 else 32
    if num_warps is None:
        num_warps = max(1, min(4, block_v // 8))
    bk = triton.next_power_of_2(dk)
    bv = min(triton.next_power_of_2(block_v), triton.next_power_of_2(dv))
    grid = (n, nv, triton.cdiv(dv, bv))
    _gdn_step_kernel[grid](
        q, k, v, a, b, a_log, dt_bias, ssm, slot_idx, start_slot, out,
        t, dk**-0.5 if scale is None else scale,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1),
        ssm.stride(0), ssm.stride(1), ssm.stride(2),
        slot_idx.stride(0), slot_idx.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        DK=dk, DV=dv, BK=bk, BV=bv, GROUP=nv // nk, FUSED_GATING=fused_gating,
        num_warps=num_warps, **pdl.launch(q),
    )  # fmt: skip
    return out
