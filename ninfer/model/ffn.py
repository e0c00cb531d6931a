"""Feed-forward blocks: SwiGLU MLP and the sparse MoE (fp32 softmax router, top-k, shared expert)."""

from __future__ import annotations

import torch
from torch import nn

from ninfer.kernels import norm_ref
from ninfer.kernels.dispatch import Ops
from ninfer.model.config import TextConfig
from ninfer.model.projections import fuse_linears, is_fused, linear, project

GATE_UP = ("gate_proj", "up_proj")  # row order of the fused weight `gate_up_proj`
ROUTER = ("gate", "shared_expert_gate")  # row order of the fused weight `router`


class MLP(nn.Module):
    """y = down(silu(gate x) * up x); fused weights with ops: `Ops.swiglu_linear` (activation + down)."""

    def __init__(self, hidden: int, inter: int, ops: Ops | None = None) -> None:
        super().__init__()
        self.ops = ops  # None: torch silu * up
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., H]
        if self.ops is not None and is_fused(self, "gate_up_proj"):  # fused: SwiGLU + down in one op
            gate_up = linear(self.ops, x, self.gate_up_proj)  # [..., 2I] = gate | up
            return self.ops.swiglu_linear(gate_up, self.down_proj.weight)
        fn = norm_ref.silu_mul if self.ops is None else self.ops.silu_mul
        gate, up = project(self, x, "gate_up_proj", GATE_UP)  # [..., I] each (views once fused)
        return linear(self.ops, fn(gate, up), self.down_proj.weight)

    def fuse_projections(self) -> None:
        """gate_proj | up_proj -> one weight `gate_up_proj` [2 I, H]."""
        fuse_linears(self, "gate_up_proj", GATE_UP)


class Experts(nn.Module):
    """Fused routed-expert weights as stored: gate_up_proj [E, 2*Ie, H], down_proj [E, H, Ie]."""

    def __init__(self, num_experts: int, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter))


class SparseMoE(nn.Module):
    """Routed experts (renormalised top-k of an fp32 softmax) plus a sigmoid-gated shared expert."""

    def __init__(self, config: TextConfig, ops: Ops) -> None:
        super().__init__()
        assert config.num_experts and config.num_experts_per_tok and config.moe_intermediate_size
        self.ops = ops
        self.top_k = config.num_experts_per_tok
        h = config.hidden_size
        self.gate = nn.Linear(h, config.num_experts, bias=False)
        self.experts = Experts(config.num_experts, h, config.moe_intermediate_size)
        self.shared_expert = MLP(h, config.shared_expert_intermediate_size or 0, ops)
        self.shared_expert_gate = nn.Linear(h, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, q, H]
        shape = x.shape
        xf = x.reshape(-1, shape[-1])  # [N, H]
        # router logits [N, E] and the shared expert's gate logit [N, 1] (views once fused)
        logits, shared_logit = project(self, xf, "router", ROUTER)
        # renormalised top-k of the fp32 softmax of the router logits: idx [N, k], w model dtype
        idx, w = self.ops.moe_route(logits, self.top_k)
        routed = self.ops.moe_experts(xf, self.experts.gate_up_proj, self.experts.down_proj, idx, w)
        # routed + sigmoid(shared gate) * shared expert
        out = self.ops.shared_expert_add(routed, shared_logit, self.shared_expert(xf))
        return out.reshape(shape)

    def fuse_projections(self) -> None:
        """gate | shared_expert_gate -> one weight `router` [E + 1, H]; the shared expert's gate | up."""
        fuse_linears(self, "router", ROUTER)
        self.shared_expert.fuse_projections()
