"""Depthwise causal conv1d + SiLU over T new tokens, with the input window carried in a slot pool (Triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton._checks import check_devices, check_int_index, last_dim_contiguous


@triton.jit
def _conv_update_kernel(
    x_ptr,  # [N, T, C]
    w_ptr,  # [C, K]
    state_ptr,  # [num_slots, C, S] raw pre-conv inputs, S >= K-1
    slot_ptr,  # [N] int (< 0: padding row)
    accepted_ptr,  # [N] int num_accepted (HAS_ACCEPTED) — the window ends at column num_accepted-1+K-2
    y_ptr,  # [N, T, C]
    C,
    s_xn, s_xt,
    s_wc,
    s_ss, s_sc, s_sl,
    s_yn, s_yt,
    T: tl.constexpr,
    K: tl.constexpr,
    S: tl.constexpr,
    KP: tl.constexpr,
    SP: tl.constexpr,
    BC: tl.constexpr,
    HAS_ACCEPTED: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0).to(tl.int64)
    offs_c = tl.program_id(1) * BC + tl.arange(0, BC)
    mask_c = offs_c < C
    slot = tl.load(slot_ptr + n).to(tl.int64)
    valid = slot >= 0
    if HAS_ACCEPTED:
        offset = tl.load(accepted_ptr + n).to(tl.int64) - 1
    else:
        offset = S - (K - 1)  # plain decode: the window is the last K-1 columns
    offset = tl.minimum(tl.maximum(offset, 0), S - (K - 1))
    state_rows = state_ptr + tl.maximum(slot, 0) * s_ss + offs_c[:, None] * s_sc  # [BC, 1]
    x_rows = x_ptr + n * s_xn + offs_c[:, None]  # [BC, 1]

    # conceptual sequence: seq = [state[:, :offset+K-1] | x_0 .. x_{T-1}]; x_t sits at offset+K-1+t
    taps = tl.arange(0, KP)
    mask_tap = taps < K
    w = tl.load(
        w_ptr + offs_c[:, None] * s_wc + taps[None, :], mask=mask_c[:, None] & mask_tap[None, :], other=0.0
    )
    w = w.to(tl.float32)  # [BC, KP]
    for t in tl.static_range(T):
        pos = t + taps  # window position; >= K-1 means a new input x[pos - (K-1)]
        from_x = (pos >= K - 1)[None, :]
        old = tl.load(
            state_rows + (offset + pos)[None, :] * s_sl,
            mask=mask_c[:, None] & mask_tap[None, :] & ~from_x & valid,
            other=0.0,
        )
        new = tl.load(
            x_rows + tl.maximum(pos - (K - 1), 0)[None, :] * s_xt,
            mask=mask_c[:, None] & mask_tap[None, :] & from_x,
            other=0.0,
        )
        acc = tl.sum(tl.where(from_x, new.to(tl.float32), old.to(tl.float32)) * w, axis=1)  # [BC]
        y = acc * tl.sigmoid(acc)
        y = tl.where(valid, y, 0.0)
        tl.store(y_ptr + n * s_yn + t * s_yt + offs_c, y.to(y_ptr.dtype.element_ty), mask=mask_c)

    # new state column c = seq[offset+K-1+T-S+c]: the last S entries of seq
    cols = tl.arange(0, SP)
    rel = T - S + cols  # >= 0: new input x[rel]; < 0: old column offset+K-1+rel
    mask_col = (cols < S)[None, :]
    keep_old = tl.load(
        state_rows + tl.maximum(offset + K - 1 + rel, 0)[None, :] * s_sl,
        mask=mask_c[:, None] & mask_col & (rel < 0)[None, :] & valid,
        other=0.0,
    )
    take_x = tl.load(
        x_rows + tl.maximum(rel, 0)[None, :] * s_xt,
        mask=mask_c[:, None] & mask_col & (rel >= 0)[None, :],
        other=0.0,
    )
    new_state = tl.where((rel >= 0)[None, :], take_x.to(tl.float32), keep_old.to(tl.float32))
    tl.debug_barrier()  # every read of this slot's window happens before it is overwritten
    tl.store(
        state_rows + cols[None, :] * s_sl,
        new_state.to(state_ptr.dtype.element_ty),
        mask=mask_c[:, None] & mask_col & valid,
    )


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    slot: torch.Tensor,
    num_accepted: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    block_c: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """Depthwise causal conv (no bias) + SiLU of T new inputs, continuing each sequence's window in place.

    x: [N, T, C] (activation dtype); weight: [C, K] or [C, 1, K]; conv_state: [num_slots, C, S]
    raw pre-conv inputs with S >= K-1 (model dtype), read and rewritten in place at `slot` [N] int
    (< 0: padding row, output zeros, nothing written).
    Window: without `num_accepted` the last K-1 columns (plain decode / shift by T); with
    `num_accepted` [N] int (speculative, S = K-1+k) the columns num_accepted-1 .. num_accepted+K-3,
    i.e. the history ends at the last accepted input of the previous call. Afterwards the slot holds
    the last S inputs of [window history | x] (requires num_accepted-1 + K-1 + T >= S).
    block_c: channels per program; by default 512 when that still gives >= 128 programs, else 128.
    returns y: [N, T, C] in x's dtype.
    """
    w = weight.reshape(weight.shape[0], -1)
    c, kernel = w.shape
    if x.dim() != 3 or x.shape[2] != c:
        raise ValueError(f"x must be [N, T, C={c}]; got {tuple(x.shape)}")
    n, t, _ = x.shape
    s = conv_state.shape[-1]
    if conv_state.dim() != 3 or conv_state.shape[1] != c or s < kernel - 1:
        raise ValueError(
            f"conv_state must be [num_slots, {c}, >= {kernel - 1}]; got {tuple(conv_state.shape)}"
        )
    if slot.shape != (n,):
        raise ValueError(f"slot must be [N] = {(n,)}; got {tuple(slot.shape)}")
    check_int_index("slot", slot)
    if num_accepted is not None:
        if num_accepted.shape != (n,):
            raise ValueError(f"num_accepted must be [N] = {(n,)}; got {tuple(num_accepted.shape)}")
        check_int_index("num_accepted", num_accepted)
        if kernel - 1 + t < s:
            raise ValueError(
                f"a window of {s} columns needs T >= {s - kernel + 1} new inputs per call (got {t})"
            )
    check_devices(x, w, conv_state, slot, *(() if num_accepted is None else (num_accepted,)))
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
    _conv_update_kernel[grid](
        x, w, conv_state, slot, slot if num_accepted is None else num_accepted, out,
        c,
        x.stride(0), x.stride(1),
        w.stride(0),
        conv_state.stride(0), conv_state.stride(1), conv_state.stride(2),
        out.stride(0), out.stride(1),
        T=t, K=kernel, S=s, KP=triton.next_power_of_2(kernel), SP=triton.next_power_of_2(s), BC=bc,
        HAS_ACCEPTED=num_accepted is not None,
        num_warps=num_warps,
    )  # fmt: skip
    return out


def causal_conv1d_with_state(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for `ninfer.kernels.conv_ref.causal_conv1d_with_state` (per-batch states, no slots).

    x: [B, T, C]; weight: [C, K] or [C, 1, K]; conv_state: [B, C, K-1].
    returns y: [B, T, C] in x's dtype and new_state: [B, C, K-1] (a new tensor, conv_state's dtype).
    """
    kernel = weight.shape[-1]
    if conv_state.shape[-1] != kernel - 1:
        raise ValueError(f"conv_state {tuple(conv_state.shape)} does not fit a kernel of width {kernel}")
    state = conv_state.clone(memory_format=torch.contiguous_format)
    rows = torch.arange(x.shape[0], dtype=torch.int32, device=x.device)
    y = causal_conv1d_update(x, weight, state, rows)
    return y, state
