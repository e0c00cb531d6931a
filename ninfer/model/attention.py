"""Gated full attention (`self_attn`): fused per-head [q | gate], q/k norm, partial MRoPE, paged GQA."""

from __future__ import annotations

import torch
from torch import nn

from ninfer.kernels.dispatch import Ops
from ninfer.model.cache import ForwardBatch, KVLayer
from ninfer.model.config import TextConfig
from ninfer.model.norms import RMSNorm1p
from ninfer.model.projections import fuse_linears, linear, project

QKV_PROJ = ("q_proj", "k_proj", "v_proj")  # row order of the fused weight `qkv_proj`
# split query and gate (a quantized artifact whose query and gate rows take two formats): the
# order of their fused runs, [query | key] and [gate | value] (one run when the formats agree)
QKV_SPLIT = ("query_proj", "k_proj", "gate_proj", "v_proj")


class GatedAttention(nn.Module):
    """One attention layer; K/V of the new tokens go into caller-owned pages before attending."""

    def __init__(self, config: TextConfig, ops: Ops) -> None:
        super().__init__()
        self.ops = ops
        self.nh, self.nkv, self.hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        h = config.hidden_size
        self.q_proj = nn.Linear(h, 2 * self.nh * self.hd, bias=False)  # per head: [query | gate]
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self.q_norm = RMSNorm1p(self.hd, eps=config.rms_norm_eps, ops=ops)
        self.k_norm = RMSNorm1p(self.hd, eps=config.rms_norm_eps, ops=ops)
        self.scale = self.hd**-0.5
        self.split_q = False  # True after `split_query_gate`: query_proj and gate_proj instead of q_proj

    def split_query_gate(self) -> None:
        """Hold the query and the output gate as two projections `query_proj`, `gate_proj`
        [nh hd, H] (each head's halves of q_proj, de-interleaved) instead of `q_proj`."""
        h = self.q_proj.in_features
        dev = self.q_proj.weight.device
        del self.q_proj
        self.query_proj = nn.Linear(h, self.nh * self.hd, bias=False, device=dev)
        self.gate_proj = nn.Linear(h, self.nh * self.hd, bias=False, device=dev)
        self.split_q = True

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: KVLayer,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """x: [B, q, H] (normed); cos/sin: [B, q, rot]; kv pools: [P, 64, nkv, hd]. -> [B, q, H]"""
        b, q, _ = x.shape
        if self.split_q:  # [B, q, nh hd] x 2, [B, q, nkv hd] x 2
            qh, kh, gate, vh = project(self, x, "qkv_proj", QKV_SPLIT)
            qh, gate = qh.view(b, q, self.nh, self.hd), gate.view(b, q, self.nh, self.hd)
        else:
            qg, kh, vh = project(self, x, "qkv_proj", QKV_PROJ)  # [B, q, 2 nh hd], [B, q, nkv hd] x 2
            qg = qg.view(b, q, self.nh, 2 * self.hd)
            qh, gate = qg[..., : self.hd], qg[..., self.hd :]  # strided views [B, q, nh, hd]
        qh = self.q_norm.rope(qh, cos, sin)  # norm + rope: [B, q, nh, hd]
        kh = self.k_norm.rope(kh.view(b, q, self.nkv, self.hd), cos, sin)
        vh = vh.view(b, q, self.nkv, self.hd)  # a strided view once fused
        self.ops.write_kv(
            kv.k, kv.v, kh, vh, batch.page_table, batch.cache_lens, k_scale=kv.k_scale, v_scale=kv.v_scale
        )
        o = self.ops.paged_attention(
            qh,
            kv.k,
            kv.v,
            batch.page_table,
            batch.cache_lens,
            self.scale,
            batch.max_kv_len,
            k_scale=kv.k_scale,
            v_scale=kv.v_scale,
        )
        return linear(self.ops, self.ops.sigmoid_gate(o, gate), self.o_proj.weight)  # o*sigmoid(gate)

    def fuse_projections(self) -> None:
        """q_proj | k_proj | v_proj -> one weight `qkv_proj` [2 nh hd + 2 nkv hd, H] (split: the
        runs of QKV_SPLIT that share a format)."""
        fuse_linears(self, "qkv_proj", QKV_SPLIT if self.split_q else QKV_PROJ)
