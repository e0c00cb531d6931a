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

    def input_norm(self, x: torch.Tensor, r: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's input x + r (r: the previous layer's deferred FFN output, None for none) and
        its norm, in one op. -> (x + r, input_layernorm(x + r)), both [B, q, H]."""
        if r is None:
            return x, self.input_layernorm(x)
        return self.input_layernorm.add(x, r)

    def forward_attention(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: KVLayer,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the layer's input [B, q, H], y = input_norm of x. -> (h, f): the layer's output is h + f,
        added by whatever normalises it next (`input_norm` of the next layer, the final norm)."""
        h, y = self.post_attention_layernorm.add(x, self.self_attn(y, cos, sin, kv, batch))
        return h, self.mlp(y)  # h = x + mixer(norm(x)), f = mlp(norm(h))

    def forward_linear(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        conv_pool: torch.Tensor,
        ssm_pool: torch.Tensor,
        slots: GDNSlots,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As `forward_attention`, with the GDN mixer on the caller's slot pools."""
        h, y = self.post_attention_layernorm.add(x, self.linear_attn(y, conv_pool, ssm_pool, slots))
        return h, self.mlp(y)

    def fuse_projections(self) -> None:
        """Concatenate the mixer's and the FFN's input projections (see `Qwen35Model.fuse_projections`)."""
        (self.self_attn if self.kind == FULL else self.linear_attn).fuse_projections()
        self.mlp.fuse_projections()
