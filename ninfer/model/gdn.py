"""Gated DeltaNet mixer (`linear_attn`): projections, carried causal conv, gated delta rule, gated norm."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ninfer.kernels.dispatch import Ops
from ninfer.model.config import TextConfig
from ninfer.model.norms import GatedRMSNorm


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
        self.norm = GatedRMSNorm(self.dv, eps=config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, h, bias=False)

    def forward(
        self, x: torch.Tensor, conv_pool: torch.Tensor, ssm_pool: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """x: [B, q, H] (normed); conv_pool: [S, C, K-1]; ssm_pool: [S, nv, dk, dv] fp32; slots: [B]."""
        b, q, _ = x.shape
        qkv = self.in_proj_qkv(x)  # [B, q, C] flat [q | k | v]
        z = self.in_proj_z(x).reshape(b, q, self.nv, self.dv)
        beta = self.in_proj_b(x).sigmoid()  # [B, q, nv] model dtype
        a = self.in_proj_a(x)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)  # [B, q, nv] fp32, <= 0

        conv_state = conv_pool.index_select(0, slots)  # [B, C, K-1]
        qkv, new_conv = self.ops.causal_conv1d_with_state(qkv, self.conv1d.weight, conv_state)
        conv_pool.index_copy_(0, slots, new_conv)

        qh, kh, vh = torch.split(qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        qh = qh.reshape(b, q, self.nk, self.dk)
        kh = kh.reshape(b, q, self.nk, self.dk)
        vh = vh.reshape(b, q, self.nv, self.dv)

        state = ssm_pool.index_select(0, slots)  # [B, nv, dk, dv] fp32
        if q == 1:
            o, new_state = self.ops.recurrent_gated_delta_rule(qh, kh, vh, g, beta, state)
        else:
            o, new_state = self.ops.chunk_gated_delta_rule(qh, kh, vh, g, beta, state)
        ssm_pool.index_copy_(0, slots, new_state.to(ssm_pool.dtype))

        y = self.norm(o, z).reshape(b, q, self.value_dim)  # o: [B, q, nv, dv] model dtype
        return self.out_proj(y)
