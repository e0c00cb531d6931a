"""Gated DeltaNet mixer (`linear_attn`): projections, carried causal conv, gated delta rule, gated norm."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ninfer.kernels.dispatch import Ops
from ninfer.kernels.gdn_ref import gdn_gates
from ninfer.model.config import TextConfig
from ninfer.model.norms import GatedRMSNorm
from ninfer.model.projections import fuse_linears, linear, project

# calls with at most this many tokens per sequence (decode, speculative verify) run the in-place
# per-token step ops on the slot pools; longer ones (prefill) the chunked rule
STEP_MAX_TOKENS = 16
# the input projections, in the row order of their fused weight `in_proj_qkvzba`
IN_PROJ = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
# q | k and v split (a quantized artifact whose q / k and v rows take two formats)
IN_PROJ_SPLIT = ("in_proj_qk", "in_proj_v", "in_proj_z", "in_proj_b", "in_proj_a")


def takes_step(q: int, per_token: bool) -> bool:
    """Whether a call of q tokens a row runs the per-token step ops (else the chunked rule);
    `per_token`: the caller asked for the state after every token."""
    return q <= STEP_MAX_TOKENS or per_token


@dataclass(frozen=True)
class GDNSlots:
    """Where each sequence's GDN state is read and written in this call."""

    start: torch.Tensor  # [B] int64, slot read (< 0: padding row)
    writes: torch.Tensor  # [B, q] int64, slot receiving the state after token t (< 0: not stored)
    per_token: bool  # True when the caller asked for intermediate states (forces the step path)


class GatedDeltaNet(nn.Module):
    """One GDN layer; its conv/ssm state lives in caller-owned slots, read and written per call."""

    def __init__(self, config: TextConfig, ops: Ops) -> None:
        super().__init__()
        self.ops = ops
        self.nk, self.nv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim, self.value_dim = config.key_dim, config.value_dim
        h, c = config.hidden_size, config.conv_dim
        self.in_proj_qkv = nn.Linear(h, c, bias=False)
        self.in_proj_z = nn.Linear(h, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(h, self.nv, bias=False)
        self.in_proj_a = nn.Linear(h, self.nv, bias=False)
        self.conv1d = nn.Module()
        self.conv1d.weight = nn.Parameter(torch.empty(c, 1, config.linear_conv_kernel_dim))
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.zeros(self.nv))
        self.norm = GatedRMSNorm(self.dv, eps=config.rms_norm_eps, ops=ops)
        self.out_proj = nn.Linear(self.value_dim, h, bias=False)
        self.split_qkv = False  # True after `split_qk_v`: in_proj_qk and in_proj_v instead of in_proj_qkv

    def split_qk_v(self) -> None:
        """Hold in_proj_qkv as `in_proj_qk` [2 key_dim, H] and `in_proj_v` [value_dim, H]."""
        h = self.in_proj_qkv.in_features
        dev = self.in_proj_qkv.weight.device
        del self.in_proj_qkv
        self.in_proj_qk = nn.Linear(h, 2 * self.key_dim, bias=False, device=dev)
        self.in_proj_v = nn.Linear(h, self.value_dim, bias=False, device=dev)
        self.split_qkv = True

    def forward(
        self, x: torch.Tensor, conv_pool: torch.Tensor, ssm_pool: torch.Tensor, slots: GDNSlots
    ) -> torch.Tensor:
        """x: [B, q, H] (normed); conv_pool: [S, C, K-1]; ssm_pool: [S, nv, dk, dv] fp32."""
        b, q, _ = x.shape
        # qkv [B, q, C] flat [q | k | v]; z [B, q, value_dim]; b_raw, a_raw [B, q, nv] model dtype
        # (views of one [B, q, C + value_dim + 2 nv] output once fused)
        if self.split_qkv:
            qk, v, z, b_raw, a_raw = project(self, x, "in_proj_qkvzba", IN_PROJ_SPLIT)
            qkv = torch.cat([qk, v], dim=-1)  # [B, q, C] for the conv over every channel
        else:
            qkv, z, b_raw, a_raw = project(self, x, "in_proj_qkvzba", IN_PROJ)
        z = z.view(b, q, self.nv, self.dv)
        if takes_step(q, slots.per_token):
            o = self._step(qkv, a_raw, b_raw, conv_pool, ssm_pool, slots)
        else:
            o = self._chunked(qkv, a_raw, b_raw, conv_pool, ssm_pool, slots.start)
        y = self.norm(o, z).reshape(b, q, self.value_dim)  # o: [B, q, nv, dv] model dtype
        return linear(self.ops, y, self.out_proj.weight)

    def fuse_projections(self) -> None:
        """in_proj_qkv | z | b | a -> one weight `in_proj_qkvzba` [C + value_dim + 2 nv, H] (split or
        mixed formats: the runs that share a format)."""
        fuse_linears(self, "in_proj_qkvzba", IN_PROJ_SPLIT if self.split_qkv else IN_PROJ)

    def _split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, q, C] -> q, k [B, q, nk, dk], v [B, q, nv, dv] (views)."""
        b, q, _ = qkv.shape
        qh, kh, vh = torch.split(qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return (
            qh.reshape(b, q, self.nk, self.dk),
            kh.reshape(b, q, self.nk, self.dk),
            vh.reshape(b, q, self.nv, self.dv),
        )

    def _step(
        self,
        qkv: torch.Tensor,
        a_raw: torch.Tensor,
        b_raw: torch.Tensor,
        conv_pool: torch.Tensor,
        ssm_pool: torch.Tensor,
        slots: GDNSlots,
    ) -> torch.Tensor:
        """In place on the pools, per-token writes; no gather/scatter of states."""
        qkv = self.ops.conv_step(qkv, self.conv1d.weight, conv_pool, slots.writes, slots.start)
        qh, kh, vh = self._split(qkv)
        return self.ops.gdn_step(
            qh, kh, vh, a_raw, b_raw, self.A_log, self.dt_bias, ssm_pool, slots.writes, slots.start
        )

    def _chunked(
        self,
        qkv: torch.Tensor,
        a_raw: torch.Tensor,
        b_raw: torch.Tensor,
        conv_pool: torch.Tensor,
        ssm_pool: torch.Tensor,
        start: torch.Tensor,
    ) -> torch.Tensor:
        """Prefill: gather the slots' states, chunked rule, write the final states back."""
        g, beta = gdn_gates(a_raw, b_raw, self.A_log, self.dt_bias)  # g fp32, beta model dtype
        conv_state = conv_pool.index_select(0, start)  # [B, C, K-1]
        qkv, new_conv = self.ops.causal_conv1d_with_state(qkv, self.conv1d.weight, conv_state)
        conv_pool.index_copy_(0, start, new_conv)
        qh, kh, vh = self._split(qkv)
        state = ssm_pool.index_select(0, start)  # [B, nv, dk, dv] fp32
        o, new_state = self.ops.chunk_gated_delta_rule(qh, kh, vh, g, beta, state)
        ssm_pool.index_copy_(0, start, new_state.to(ssm_pool.dtype))
        return o
