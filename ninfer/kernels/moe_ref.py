"""Torch reference of routed-expert compute over fused 3-D expert weights (eager loop, ascending id)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.formats import QuantWeight
from ninfer.kernels.quant_ref import expert


def moe_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor | QuantWeight,
    down: torch.Tensor | QuantWeight,
    topk_idx: torch.Tensor,
    topk_w: torch.Tensor,
) -> torch.Tensor:
    """Sum over each token's chosen experts of w * down_e(silu(gate_e x) * up_e x).

    x: [N, H]; gate_up: [E, 2*Ie, H] (gate rows first); down: [E, H, Ie];
    topk_idx: [N, k] int64; topk_w: [N, k] (x's dtype). returns [N, H] in x's dtype.
    Experts are visited in ascending id and accumulated with index_add_ into zeros, the order
    the transformers eager implementation uses (this matters in bf16). Host-syncs on the hit set.
    Quantized banks: each visited expert is dequantized to x's dtype.
    """
    out = torch.zeros_like(x)
    hit = torch.bincount(topk_idx.reshape(-1), minlength=gate_up.shape[0]).nonzero().reshape(-1)
    for e in hit.tolist():
        tok, slot = torch.where(topk_idx == e)
        gate, up = F.linear(x[tok], expert(gate_up, e, x.dtype)).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, expert(down, e, x.dtype))
        y = y * topk_w[tok, slot, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


def route(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Router: fp32 softmax over the experts, top-k, renormalised, cast to the logits' dtype.

    logits: [N, E]. returns (topk_idx [N, k] int64, topk_w [N, k] in logits' dtype).
    """
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    w, idx = torch.topk(probs, k, dim=-1)
    return idx, (w / w.sum(-1, keepdim=True)).to(logits.dtype)
