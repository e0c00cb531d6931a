"""The Qwen3.5/3.6 text model (dense or MoE): embeddings, hybrid decoder stack, final norm, untied lm_head."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from ninfer.kernels.dispatch import Ops, get_ops
from ninfer.model.cache import ForwardBatch, KVPool, StatePool
from ninfer.model.config import FULL, TextConfig
from ninfer.model.gdn import GDNSlots
from ninfer.model.layer_steps import LayerSteps, compiled_steps, steps_for
from ninfer.model.layers import DecoderLayer
from ninfer.model.norms import RMSNorm1p
from ninfer.model.projections import linear
from ninfer.model.rope import MRotaryEmbedding

if TYPE_CHECKING:
    from ninfer.model.mtp import MTPHead


class Qwen35Model(nn.Module):
    """Stateless over sequences: every call reads and writes the caller's KV pages and GDN slots."""

    def __init__(self, config: TextConfig, ops: Ops | None = None) -> None:
        super().__init__()
        self.config = config
        self.ops = ops or get_ops("cpu")
        # no init draw: every weight is assigned at load (nn.Embedding's normal_ init on the meta
        # device imports torch._dynamo, ~2 s of every process start)
        table = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=table)
        self.layers = nn.ModuleList(DecoderLayer(config, t, self.ops) for t in config.layer_types)
        self.norm = RMSNorm1p(config.hidden_size, config.rms_norm_eps, self.ops)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # pool index of each layer: a-th attention layer / l-th GDN layer
        self.pool_index = [
            (config.attention_layers if t == FULL else config.linear_layers).index(i)
            for i, t in enumerate(config.layer_types)
        ]
        self.rotary: MRotaryEmbedding | None = None  # built on the target device by `init_buffers`
        self.mtp: MTPHead | None = None
        # decoder layers whose outputs `forward` keeps in `captured` (a DFlash drafter's features)
        self.capture_layers: tuple[int, ...] = ()
        self.captured: dict[int, torch.Tensor] = {}
        # called with i after decoder layer i (None: no call); a graph capture cuts its step there
        self.layer_hook: Callable[[int], None] | None = None
        # one compiled step per layer kind (`compile_layers`); None: every layer runs eagerly
        self.layer_steps: LayerSteps | None = None

    def init_buffers(self, device: torch.device | str) -> None:
        """(Re)build non-weight buffers (rope tables) on `device`; needed after meta-device construction."""
        self.rotary = MRotaryEmbedding(self.config, device)

    def set_ops(self, ops: Ops) -> None:
        """Switch every layer to another kernel backend."""
        self.ops = ops
        for m in self.modules():
            if hasattr(m, "ops"):
                m.ops = ops

    @contextmanager
    def one_layer_per_kind(self) -> Iterator[bool]:
        """Within the block, `forward` runs the first decoder layer of each kind alone (the layers
        of a kind run the same kernels at the same shapes, so a forward reaches every kernel a full
        one does, at a fraction of its cost: the engine's warm-up). Yields False and leaves the
        model whole when a drafter reads captured layer outputs."""
        if self.capture_layers:
            yield False
            return
        types = self.config.layer_types
        keep = [i for i, t in enumerate(types) if t not in types[:i]]  # each kind's first layer
        layers, index = self.layers, self.pool_index
        self.layers = nn.ModuleList(layers[i] for i in keep)
        self.pool_index = [index[i] for i in keep]
        try:
            yield True
        finally:
            self.layers, self.pool_index = layers, index

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype (the norms' weights are always dense, in the model dtype)."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def weight_bytes(self) -> int:
        """Device bytes of the weights: dense parameters and quantized planes (MTP head included)."""
        from ninfer.model.quantized import quantized_weights

        dense = sum(p.numel() * p.element_size() for p in self.parameters())
        return dense + sum(q.nbytes for q in quantized_weights(self))

    def reserve_quantized(self) -> None:
        """Let the backend prepare for the quantized weights prefill multiplies (the decoder layers'
        and the MTP head's; the embedding is looked up and prefill's lm_head takes few rows)."""
        from ninfer.model.quantized import quantized_weights

        weights = quantized_weights(self.layers) + ([] if self.mtp is None else quantized_weights(self.mtp))
        self.ops.reserve_quantized(weights, self.dtype)

    def split_projections(self, query_gate: bool, qk_v: bool) -> None:
        """Before loading: hold every attention layer's query / gate, every GDN layer's q|k / v as
        separate projections (the layout of a quantized artifact that gives their rows two formats)."""
        for layer in self.layers:
            if layer.kind == FULL and query_gate:
                layer.self_attn.split_query_gate()
            elif layer.kind != FULL and qk_v:
                layer.linear_attn.split_qk_v()

    def compile_layers(
        self, dynamic: bool | None = None, backend: str = "inductor", recompile_limit: int = 64
    ) -> None:
        """Run step-sized calls (decode, verify, captured prefill rows) through one compiled step
        per decoder-layer kind, shared by every layer of the kind and by the MTP head's layer
        (regional compilation, `ninfer.model.layer_steps`); longer prefill chunks stay eager.
        Compiles lazily, at the first call of each shape class."""
        self.layer_steps = compiled_steps(dynamic, backend, recompile_limit)
        if self.mtp is not None:
            self.mtp.layer_steps = self.layer_steps

    def eager_layers(self) -> None:
        """Drop the compiled layer steps (`compile_layers`): every layer runs eagerly again."""
        self.layer_steps = None
        if self.mtp is not None:
            self.mtp.layer_steps = None

    @property
    def mtp_available(self) -> bool:
        return self.mtp is not None

    def forward(self, batch: ForwardBatch, kv: KVPool, states: StatePool) -> torch.Tensor:
        """Run q new tokens of B sequences. -> hidden [B, q, H] after the final norm."""
        if self.rotary is None:
            raise RuntimeError("call init_buffers(device) (or build the model with load_model) first")
        x = self.embed_tokens(batch.input_ids) if batch.embeds is None else batch.embeds  # [B, q, H]
        cos, sin = self.rotary(batch.positions, x.dtype)  # [B, q, rot]
        slots = GDNSlots(batch.slots, batch.gdn_write_slots(), batch.write_slots is not None)
        steps = steps_for(self.layer_steps, batch)  # compiled per layer kind, or eager
        captured: dict[int, torch.Tensor] = {}
        f: torch.Tensor | None = None  # the previous layer's FFN output, added by the next norm
        for i, (layer, j) in enumerate(zip(self.layers, self.pool_index, strict=True)):
            x, y = layer.input_norm(x, f)  # x: layer i-1's output [B, q, H], y: its norm
            if i - 1 in self.capture_layers:
                captured[i - 1] = x  # [B, q, H] the layer's output (before the final norm)
            if layer.kind == FULL:
                x, f = steps.attention(layer, x, y, cos, sin, kv.layer(j), batch)
            else:
                x, f = steps.linear(layer, x, y, states.conv[j], states.ssm[j], slots)
            if self.layer_hook is not None:
                self.layer_hook(i)
        assert f is not None, "a model has at least one layer"
        x, y = self.norm.add(x, f)
        if len(self.layers) - 1 in self.capture_layers:
            captured[len(self.layers) - 1] = x
        if self.capture_layers:
            self.captured = captured
        return y

    def fuse_projections(self) -> None:
        """Concatenate, layer by layer, the projections that read one input into one weight each (GDN
        in_proj_qkv|z|b|a, attention q|k|v, MLP and shared-expert gate|up, MoE router|shared gate),
        freeing the originals as it goes; the MTP head's layer too. Outputs are unchanged (one GEMM
        per group instead of several; views split it). state_dict keeps the canonical names."""
        for layer in self.layers:
            layer.fuse_projections()
        if self.mtp is not None:
            self.mtp.fuse_projections()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> float32 logits [..., vocab] (lm_head in the model dtype, then cast)."""
        return linear(self.ops, hidden, self.lm_head.weight).float()
