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
