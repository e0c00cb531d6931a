"""Decoder layer: pre-norm mixer (GDN or gated attention) and pre-norm FFN (dense or MoE), both residual."""

from __future__ import annotations

import torch
from torch import nn

from ninfer.kernels.dispatch import Ops
from ninfer.model.attention import GatedAttention
from ninfer.model.cache import ForwardBatch, KVLayer
from ninfer.model.config import FULL, TextConfig
from ninfer.model.ffn import MLP, SparseMoE
from ninfer.model.gdn import GatedDeltaNet, GDNSlots
from ninfer.model.norms import RMSNorm1p


def make_ffn(config: TextConfig, ops: Ops) -> nn.Module:
    if config.is_moe:
        return SparseMoE(config, ops)
    return MLP(config.hidden_size, config.intermediate_size or 0, ops)


class DecoderLayer(nn.Module):
    """Mixer is `self_attn` when `kind` is full attention, else `linear_attn`."""

    def __init__(self, config: TextConfig, kind: str, ops: Ops) -> None:
        super().__init__()
        self.kind = kind
        if kind == FULL:
            self.self_attn = GatedAttention(config, ops)
        else:
            self.linear_attn = GatedDeltaNet(config, ops)
        self.mlp = make_ffn(config, ops)
        self.input_layernorm = RMSNorm1p(config.hidden_size, config.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm1p(config.hidden_size, config.rms_norm_eps, ops)

    def forward_attention(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: KVLayer,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        h, y = self.post_attention_layernorm.add(
            x, self.self_attn(self.input_layernorm(x), cos, sin, kv, batch)
        )
        return h + self.mlp(y)  # h = x + mixer(norm(x)), y = norm(h)

    def forward_linear(
        self, x: torch.Tensor, conv_pool: torch.Tensor, ssm_pool: torch.Tensor, slots: GDNSlots
    ) -> torch.Tensor:
        h, y = self.post_attention_layernorm.add(
            x, self.linear_attn(self.input_layernorm(x), conv_pool, ssm_pool, slots)
        )
        return h + self.mlp(y)
