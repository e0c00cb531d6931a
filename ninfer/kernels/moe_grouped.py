"""Routed-expert compute without host syncs: sort-by-expert + grouped GEMM, or gathered expert weights + bmm."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# at most this many (token, expert) rows take the gathered-weights path in `moe_experts_auto`
GATHER_MAX_ROWS = 64


def _combine(y: torch.Tensor, tok: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    """Sum rows y [M, H] (weights w [M]) into their tokens tok [M] -> fp32 [n, H]."""
    out = torch.zeros(n, y.shape[-1], dtype=torch.float32, device=y.device)
    return out.index_add_(0, tok, y.float() * w.float()[:, None])


def moe_experts_grouped(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_w: torch.Tensor,
) -> torch.Tensor:
    """Same contract as `moe_ref.moe_experts`, computed as two grouped GEMMs (`torch._grouped_mm`).

    The N·k (token, expert) rows are sorted by expert (stable), each expert's rows multiply its own
    weights, and the weighted rows are summed per token in fp32. Group sizes stay on the device, so
    there is no host sync (CUDA-graph capturable where `_grouped_mm` is: bf16 on sm_90+).
    x: [N, H]; gate_up: [E, 2*Ie, H]; down: [E, H, Ie]; topk_idx, topk_w: [N, k]. returns [N, H].
    """
    n, k = topk_idx.shape
    e = gate_up.shape[0]
    flat = topk_idx.reshape(-1)  # [N*k]
    order = torch.argsort(flat, stable=True)  # rows grouped by expert, token order inside a group
    counts = torch.zeros(e, dtype=torch.int32, device=x.device)
    counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = counts.cumsum(0, dtype=torch.int32)  # [E] end row of each expert's group
    tok = torch.div(order, k, rounding_mode="floor")  # [N*k] token of each sorted row
    h = torch._grouped_mm(x[tok], gate_up.transpose(1, 2), offs=offs)  # [N*k, 2*Ie]
    gate, up = h.chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, down.transpose(1, 2), offs=offs)  # [N*k, H]
    return _combine(y, tok, topk_w.reshape(-1)[order], n).to(x.dtype)


def moe_experts_gathered(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_w: torch.Tensor,
) -> torch.Tensor:
    """Same contract as `moe_ref.moe_experts` for few rows (decode): gather the chosen experts'
    weight slices ([N*k, 2*Ie, H] and [N*k, H, Ie]) and use batched matmuls. No host sync; reads
    only the active experts' weights, but copies them once (memory N·k expert slices)."""
    n, k = topk_idx.shape
    flat = topk_idx.reshape(-1)  # [N*k]
    xs = x.repeat_interleave(k, dim=0).unsqueeze(-1)  # [N*k, H, 1]
    h = torch.bmm(gate_up.index_select(0, flat), xs).squeeze(-1)  # [N*k, 2*Ie]
    gate, up = h.chunk(2, dim=-1)
    act = (F.silu(gate) * up).unsqueeze(-1)  # [N*k, Ie, 1]
    y = torch.bmm(down.index_select(0, flat), act).squeeze(-1)  # [N*k, H]
    tok = torch.arange(n, device=x.device).repeat_interleave(k)
    return _combine(y, tok, topk_w.reshape(-1), n).to(x.dtype)
