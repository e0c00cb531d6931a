"""Depthwise causal conv1d + SiLU over T tokens with per-token window writes into a slot pool (Triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton import pdl
from ninfer.kernels.triton._checks import check_devices, check_int_index, last_dim_contiguous
from ninfer.kernels.triton.pdl import pdl_enter


@triton.jit
def _column(old, cols, j: tl.constexpr):
    """Column j of a register tile [BC, SP] -> [BC] (a masked row sum; no dynamic register indexing)."""
    return tl.sum(tl.where(cols[None, :] == j, old, 0.0), axis=1)


@triton.jit
def _conv_step_kernel(
    x_ptr,  # [N, T, C]
    w_ptr,  # [C, K]
    state_ptr,  # [num_slots, C, K-1] raw pre-conv inputs
    slot_ptr,  # [N, T] int: slot that receives the window after token t (< 0: not stored)
    start_ptr,  # [N] int: slot the window is read from (< 0: padding row)
    y_ptr,  # [N, T, C]
    C,
    s_xn, s_xt,
    s_wc,
    s_ss, s_sc, s_sl,
    s_in, s_it,
    s_yn, s_yt,
    T: tl.constexpr,
    K: tl.constexpr,
    SP: tl.constexpr,
    BC: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
    n = tl.program_id(0).to(tl.int64)
    offs_c = tl.program_id(1) * BC + tl.arange(0, BC)
    mask_c = offs_c < C
    start = tl.load(start_ptr + n).to(tl.int64)
    valid = start >= 0
    cols = tl.arange(0, SP)
    mask_tile = mask_c[:, None] & (cols < K - 1)[None, :]
    # the whole carried window goes to registers before any store, so a row may overwrite its start slot
    old = tl.load(
        state_ptr + tl.maximum(start, 0) * s_ss + offs_c[:, None] * s_sc + cols[None, :] * s_sl,
        mask=mask_tile & valid,
        other=0.0,
    ).to(tl.float32)  # [BC, SP]
    tl.debug_barrier()
    x_rows = x_ptr + n * s_xn + offs_c  # [BC]

    # conceptual sequence seq = [window (K-1 columns) | x_0 .. x_{T-1}]. Tokens t < K-1 read the
    # carried window: unrolled, so every register index is static.
    for t in tl.static_range(K - 1):
        if t < T:
            acc = tl.zeros([BC], dtype=tl.float32)
            for j in tl.static_range(K):
                wj = tl.load(w_ptr + offs_c * s_wc + j, mask=mask_c, other=0.0).to(tl.float32)
                if t + j < K - 1:
                    val = _column(old, cols, t + j)
                else:
                    val = tl.load(x_rows + (t + j - (K - 1)) * s_xt, mask=mask_c, other=0.0).to(tl.float32)
                acc += val * wj
            y = acc * tl.sigmoid(acc)
            y = tl.where(valid, y, 0.0)
            tl.store(y_ptr + n * s_yn + t * s_yt + offs_c, y.to(y_ptr.dtype.element_ty), mask=mask_c)

            # window after token t: column c = seq[t + 1 + c]
            win = tl.zeros([BC, SP], dtype=tl.float32)
            for c in tl.static_range(K - 1):
                if t + 1 + c < K - 1:
                    val = _column(old, cols, t + 1 + c)
                else:
                    x_at = x_rows + (t + 1 + c - (K - 1)) * s_xt
                    val = tl.load(x_at, mask=mask_c, other=0.0).to(tl.float32)
                win = tl.where(cols[None, :] == c, val[:, None], win)
            slot = tl.load(slot_ptr + n * s_in + t * s_it).to(tl.int64)
            tl.store(
                state_ptr + tl.maximum(slot, 0) * s_ss + offs_c[:, None] * s_sc + cols[None, :] * s_sl,
                win.to(state_ptr.dtype.element_ty),
                mask=mask_tile & valid & (slot >= 0),
            )

    # Tokens t >= K-1 read x alone: a loop (not unrolled), so prefill-sized T stays one small kernel.
    # Its names are its own: a name shared with the unrolled part would be loop-carried (one type).
    for t in range(K - 1, T):
        acc_t = tl.zeros([BC], dtype=tl.float32)
        for j in tl.static_range(K):  # the same summation order as the unrolled tokens
            w_j = tl.load(w_ptr + offs_c * s_wc + j, mask=mask_c, other=0.0).to(tl.float32)
            x_j = tl.load(x_rows + (t + j - (K - 1)) * s_xt, mask=mask_c, other=0.0).to(tl.float32)
            acc_t += x_j * w_j
        y_t = acc_t * tl.sigmoid(acc_t)
        y_t = tl.where(valid, y_t, 0.0)
        tl.store(y_ptr + n * s_yn + t * s_yt + offs_c, y_t.to(y_ptr.dtype.element_ty), mask=mask_c)

        # window after token t: x_{t-K+2} .. x_t
        slot_t = tl.load(slot_ptr + n * s_in + t * s_it).to(tl.int64)
        win_t = tl.load(x_rows[:, None] + (t - (K - 2) + cols[None, :]) * s_xt, mask=mask_tile, other=0.0)
        tl.store(
            state_ptr + tl.maximum(slot_t, 0) * s_ss + offs_c[:, None] * s_sc + cols[None, :] * s_sl,
            win_t.to(state_ptr.dtype.element_ty),
            mask=mask_tile & valid & (slot_t >= 0),
        )


def conv_step(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_pool: torch.Tensor,
    slot_idx: torch.Tensor,
    start_slot: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    block_c: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """Depthwise causal conv (no bias) + SiLU of T new inputs per sequence over a slot pool, in place.

    x: [N, T, C]; weight: [C, K] or [C, 1, K]; conv_pool: [num_slots, C, K-1] raw pre-conv inputs;
    slot_idx: [N, T] int, the slot that receives the window (last K-1 inputs) after token t
    (< 0: not stored); start_slot: [N] int, the slot the window is read from (< 0: padding row:
    output zeros, nothing written). Same semantics as `ninfer.kernels.conv_ref.conv_step`.
    One compile per T: the first K-1 tokens are unrolled, the rest run in a loop (decode, verify
    and short prefill sizes).
    returns y: [N, T, C] in x's dtype (written into `out` when given).
    """
    w = weight.reshape(weight.shape[0], -1)
    c, kernel = w.shape
    if x.dim() != 3 or x.shape[2] != c:
        raise ValueError(f"x must be [N, T, C={c}]; got {tuple(x.shape)}")
    n, t, _ = x.shape
    if conv_pool.dim() != 3 or conv_pool.shape[1:] != (c, kernel - 1):
        raise ValueError(f"conv_pool must be [num_slots, {c}, {kernel - 1}]; got {tuple(conv_pool.shape)}")
    if slot_idx.shape != (n, t) or start_slot.shape != (n,):
        raise ValueError(
            f"slot_idx must be [N, T] = {(n, t)} and start_slot [N]; got "
            f"{tuple(slot_idx.shape)}, {tuple(start_slot.shape)}"
        )
    check_int_index("slot_idx", slot_idx)
    check_int_index("start_slot", start_slot)
    check_devices(x, w, conv_pool, slot_idx, start_slot)
    last_dim_contiguous(x=x, weight=w)
    if out is None:
        out = torch.empty(n, t, c, dtype=x.dtype, device=x.device)
    elif out.shape != (n, t, c) or out.stride(2) != 1:
        raise ValueError(f"out must be [N, T, C] = {(n, t, c)} with a contiguous last dim")
    if n == 0 or t == 0:
        return out
    if block_c is None:
        block_c = 512 if n * triton.cdiv(c, 512) >= 128 else 128
    bc = min(triton.next_power_of_2(block_c), triton.next_power_of_2(c))
    grid = (n, triton.cdiv(c, bc))
    _conv_step_kernel[grid](
        x, w, conv_pool, slot_idx, start_slot, out,
        c,
        x.stride(0), x.stride(1),
        w.stride(0),
        conv_pool.stride(0), conv_pool.stride(1), conv_pool.stride(2),
        slot_idx.stride(0), slot_idx.stride(1),
        out.stride(0), out.stride(1),
        T=t, K=kernel, SP=max(2, triton.next_power_of_2(kernel - 1)), BC=bc, **pdl.launch(x),
        num_warps=num_warps,
    )  # fmt: skip
    return out
