"""Tiny random models (dense / MoE, both layer kinds, an MTP head) and the runs the fusion tests compare."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ninfer.kernels.dispatch import Ops, get_ops
from ninfer.model.cache import KVPool, StatePool, make_batch
from ninfer.model.config import DENSE, FULL, LINEAR, MOE, TextConfig
from ninfer.model.mtp import MTPHead
from ninfer.model.qwen35 import Qwen35Model

VOCAB = 320
LAYERS = (LINEAR, FULL, LINEAR, LINEAR, FULL)
PAGES = [[3, 0], [1, 4]]  # two sequences, two 64-token pages each, out of order


def tiny_config(kind: str, layers: tuple[str, ...] = LAYERS) -> TextConfig:
    """Value heads 2x key heads, value head dim != key head dim, head_dim != hidden / heads."""
    extra = (
        dict(family=DENSE, intermediate_size=112)
        if kind == "dense"
        else dict(family=MOE, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=40,
                  shared_expert_intermediate_size=56)
    )  # fmt: skip
    return TextConfig(vocab_size=VOCAB, hidden_size=80, num_hidden_layers=len(layers), layer_types=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                      linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24,
                      mrope_section=(2, 1, 1), mtp_num_hidden_layers=1, **extra)  # fmt: skip


def _randomise(module: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.01, 4, generator=gen).log())
            elif name.endswith("dt_bias") or "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + name.endswith("linear_attn.norm.weight"))
            elif name.endswith("conv1d.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.6 / p.shape[-1] ** 0.5)


def tiny_model(
    kind: str, dtype: torch.dtype = torch.float32, ops: Ops | None = None, layers: tuple[str, ...] = LAYERS
) -> Qwen35Model:
    """A random unfused model with a bound random MTP head, in `dtype`, on the CPU."""
    cfg = tiny_config(kind, layers)
    gen = torch.Generator().manual_seed(11 if kind == "dense" else 12)
    model = Qwen35Model(cfg, ops or get_ops("cpu", "reference"))
    head = MTPHead(cfg, model.ops)
    _randomise(model, gen)
    _randomise(head, gen)
    model = model.to(dtype).eval().requires_grad_(False)
    model.init_buffers("cpu")
    assert model.rotary is not None
    head = head.to(dtype).eval().requires_grad_(False)
    head.bind(model.embed_tokens, model.lm_head, model.rotary)
    model.mtp = head
    return model


def fused_copy(model: Qwen35Model) -> Qwen35Model:
    """A deep copy with fused projections, bound to the copy's own embedding / lm_head / rotary."""
    out = copy.deepcopy(model)
    assert out.mtp is not None and out.rotary is not None
    out.mtp.bind(out.embed_tokens, out.lm_head, out.rotary)
    out.fuse_projections()
    return out


@dataclass
class Outcome:
    """Everything a run produced: logits per phase, MTP logits, the pools afterwards."""

    logits: list[torch.Tensor]
    mtp_logits: torch.Tensor
    pools: list[torch.Tensor]

    def all_logits(self) -> list[torch.Tensor]:
        return [*self.logits, self.mtp_logits]


def run_phases(model: Qwen35Model, seed: int = 0) -> Outcome:
    """Prefill two sequences (30 and 20 tokens: the chunked path), one batched decode step (q = 1),
    one verify call (q = 4, per-token state writes into slots 2..5), an MTP step over the verify rows."""
    cfg, dtype = model.config, model.embed_tokens.weight.dtype
    ids = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(seed)).tolist()
    kv = KVPool.for_config(cfg, 5, dtype, "cpu")
    st = StatePool.for_config(cfg, 6, dtype, "cpu")
    mtp_kv = KVPool.for_config(cfg, 5, dtype, "cpu", num_layers=1)
    lens = [30, 20]
    out: list[torch.Tensor] = []
    with torch.no_grad():
        for b in range(2):
            batch = make_batch([ids[b][: lens[b]]], [0], [b], [PAGES[b]])
            out.append(model.logits(model(batch, kv, st)))
        batch = make_batch([[ids[0][30]], [ids[1][20]]], [30, 20], [0, 1], PAGES)
        out.append(model.logits(model(batch, kv, st)))
        rows = [ids[0][31:35], ids[1][21:25]]
        verify = make_batch(rows, [31, 21], [0, 1], PAGES, write_slots=[[2, 3, -1, 4], [5, -1, -1, -1]])
        hidden = model(verify, kv, st)  # [2, 4, H]
        out.append(model.logits(hidden))
        assert model.mtp is not None
        nxt = make_batch([ids[0][32:36], ids[1][22:26]], [0, 0], [0, 1], PAGES)  # its own KV pool
        mtp_logits = model.mtp.logits(model.mtp(nxt, hidden, mtp_kv))
    pools = [*kv.k, *kv.v, *st.conv, *st.ssm, *mtp_kv.k, *mtp_kv.v]
    return Outcome(out, mtp_logits, pools)
