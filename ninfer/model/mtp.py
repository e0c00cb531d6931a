"""Multi-token-prediction head: fc(cat[norm_e(embed(t+1)), norm_h(h_t)]) -> one attention layer -> norm -> lm_head."""

from __future__ import annotations

import torch
from torch import nn

from ninfer.kernels.dispatch import Ops
from ninfer.model.cache import ForwardBatch, KVPool
from ninfer.model.config import FULL, TextConfig
from ninfer.model.layer_steps import LayerSteps, steps_for
from ninfer.model.layers import DecoderLayer
from ninfer.model.norms import RMSNorm1p
from ninfer.model.projections import linear
from ninfer.model.rope import MRotaryEmbedding


class MTPHead(nn.Module):
    """Shares the trunk's embedding, rotary and lm_head; owns a one-layer KV pool (passed by the caller)."""

    def __init__(self, config: TextConfig, ops: Ops) -> None:
        super().__init__()
        if config.mtp_num_hidden_layers not in (0, 1):
            raise ValueError(
                f"mtp_num_hidden_layers={config.mtp_num_hidden_layers}: only one MTP layer is supported"
            )
        self.config = config
        self.ops = ops
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = RMSNorm1p(h, config.rms_norm_eps, ops)
        self.pre_fc_norm_hidden = RMSNorm1p(h, config.rms_norm_eps, ops)
        self.layers = nn.ModuleList([DecoderLayer(config, FULL, ops)])
        self.norm = RMSNorm1p(h, config.rms_norm_eps, ops)
        # shared with the trunk, not registered as submodules (their weights belong to the trunk)
        self._shared: dict[str, nn.Module] = {}
        # the trunk's compiled layer steps (`Qwen35Model.compile_layers`); None: eager
        self.layer_steps: LayerSteps | None = None

    def bind(self, embed_tokens: nn.Embedding, lm_head: nn.Linear, rotary: MRotaryEmbedding) -> None:
        self._shared = {"embed": embed_tokens, "lm_head": lm_head, "rotary": rotary}

    def forward(self, batch: ForwardBatch, hidden: torch.Tensor, kv: KVPool) -> torch.Tensor:
        """batch.input_ids = the tokens after the trunk's (row i: token i+1), positions as the trunk's row i;
        hidden: the trunk's final hidden [B, q, H] (row i). -> MTP hidden [B, q, H] after `mtp.norm`."""
        if not self._shared:
            raise RuntimeError("MTPHead is not bound to a trunk (use load_mtp)")
        e = self.pre_fc_norm_embedding(self._shared["embed"](batch.input_ids))
        x = linear(self.ops, torch.cat([e, self.pre_fc_norm_hidden(hidden)], dim=-1), self.fc.weight)
        cos, sin = self._shared["rotary"](batch.positions, x.dtype)
        layer = self.layers[0]
        x, y = layer.input_norm(x, None)
        attention = steps_for(self.layer_steps, batch).attention  # the trunk's attention-layer step
        h, f = attention(layer, x, y, cos, sin, kv.layer(0), batch)
        return self.norm.add(h, f)[1]  # norm(h + f)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """MTP hidden [..., H] -> float32 logits through the shared lm_head."""
        return linear(self.ops, hidden, self._shared["lm_head"].weight).float()

    def fuse_projections(self) -> None:
        """Fuse the decoder layer's projections (see `Qwen35Model.fuse_projections`)."""
        self.layers[0].fuse_projections()
