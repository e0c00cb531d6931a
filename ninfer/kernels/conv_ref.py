"""Torch reference of the depthwise causal conv1d + SiLU that carries a K-1 input window."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d_with_state(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv (no bias) followed by SiLU, continuing from a carried window.

    x: [B, T, C] (time-major, activation dtype); weight: [C, K] or [C, 1, K];
    conv_state: [B, C, K-1], the last K-1 pre-conv inputs (zeros for a fresh sequence).
    returns y: [B, T, C] in x's dtype and new_state: [B, C, K-1] (the last K-1 inputs of
    [conv_state | x]), in conv_state's dtype.
    """
    w = weight.reshape(weight.shape[0], -1)  # [C, K]
    c, kernel = w.shape
    t = x.shape[1]
    if conv_state.shape[-1] != kernel - 1 or conv_state.shape[1] != c:
        raise ValueError(f"conv_state {tuple(conv_state.shape)} does not fit weight {tuple(w.shape)}")
    full = torch.cat([conv_state.to(w.dtype), x.transpose(1, 2).to(w.dtype)], dim=-1)  # [B, C, K-1+T]
    y = F.conv1d(full, w.unsqueeze(1), None, padding=0, groups=c)  # [B, C, T]
    y = F.silu(y)
    new_state = full[:, :, t:].to(conv_state.dtype)  # last K-1 columns
    return y.transpose(1, 2).to(x.dtype), new_state


def conv_step(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_pool: torch.Tensor,
    slot_idx: torch.Tensor,
    start_slot: torch.Tensor,
) -> torch.Tensor:
    """`causal_conv1d_with_state` over T tokens per sequence with the window kept in a slot pool.

    x: [N, T, C]; weight: [C, K] or [C, 1, K]; conv_pool: [num_slots, C, K-1], updated in place;
    slot_idx: [N, T] int, the slot that receives the window after token t (its last K-1 inputs;
    < 0: not stored); start_slot: [N] int, the slot the window is read from (< 0: padding row:
    zero history, output zeros, nothing written). All reads happen before any write.
    returns y: [N, T, C] in x's dtype. Synchronises with the device on the write masks.
    """
    w = weight.reshape(weight.shape[0], -1)  # [C, K]
    c, kernel = w.shape
    t = x.shape[1]
    if conv_pool.shape[1:] != (c, kernel - 1):
        raise ValueError(f"conv_pool {tuple(conv_pool.shape)} does not fit weight {tuple(w.shape)}")
    valid = start_slot >= 0  # [N]
    state = conv_pool.index_select(0, start_slot.clamp(min=0))
    state = torch.where(valid[:, None, None], state, 0.0)  # [N, C, K-1]
    full = torch.cat([state.to(w.dtype), x.transpose(1, 2).to(w.dtype)], dim=-1)  # [N, C, K-1+T]
    y = F.silu(F.conv1d(full, w.unsqueeze(1), None, padding=0, groups=c))  # [N, C, T]
    for i in range(t):
        keep = (slot_idx[:, i] >= 0) & valid
        conv_pool[slot_idx[keep, i]] = full[keep, :, i + 1 : i + kernel].to(conv_pool.dtype)
    y = torch.where(valid[:, None, None], y, 0.0)
    return y.transpose(1, 2).to(x.dtype)
