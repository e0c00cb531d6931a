"""Tiny random transformers Qwen3.5 models (dense / MoE) and the matching ninfer models, for reference tests."""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

from ninfer.model.cache import PAGE_SIZE, KVPool, StatePool, make_batch
from ninfer.model.config import TextConfig
from ninfer.model.qwen35 import Qwen35Model
from ninfer.model.weights import load_model

VOCAB = 512
GAIN = 0.5  # std * sqrt(fan_in) of the random linear weights


def hf_config(kind: str, **overrides: Any) -> Qwen3_5TextConfig | Qwen3_5MoeTextConfig:
    """Every code path: both layer kinds, GDN value heads 2x (dense) / 3x (MoE) key heads, partial rotary."""
    common: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=96,
        num_hidden_layers=5,
        layer_types=[
            "linear_attention",
            "full_attention",
            "linear_attention",
            "linear_attention",
            "full_attention",
        ],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_key_head_dim=16,
        linear_value_head_dim=24,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        tie_word_embeddings=False,
    )
    if kind == "dense":
        common.update(linear_num_key_heads=2, linear_num_value_heads=4, intermediate_size=160)
        common.update(overrides)
        return Qwen3_5TextConfig(**common)
    common.update(
        linear_num_key_heads=2,
        linear_num_value_heads=6,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=64,
    )
    common.update(overrides)
    return Qwen3_5MoeTextConfig(**common)


def hf_model(
    kind: str, seed: int = 0, dtype: torch.dtype = torch.float32, router_gain: float = 1.0, **overrides: Any
) -> torch.nn.Module:
    """A transformers model with every parameter randomised (norm offsets and A_log included).

    `router_gain` scales the MoE router: larger margins between experts keep bf16 rounding from
    flipping a token's expert choice, which would make bf16 comparisons meaningless."""
    cfg = hf_config(kind, **overrides)
    torch.manual_seed(seed)
    cls = Qwen3_5ForCausalLM if kind == "dense" else Qwen3_5MoeForCausalLM
    if kind == "moe":
        cfg._experts_implementation = "eager"
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.01, 4).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn_like(p) * 0.5)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn_like(p) * router_gain / p.shape[-1] ** 0.5)
            elif name.endswith("conv1d.weight"):
                p.copy_(torch.randn_like(p) * 0.25)
            elif "norm" in name:
                p.copy_(
                    torch.randn_like(p) * 0.2 + (1.0 if name.endswith("linear_attn.norm.weight") else 0.0)
                )
            else:
                p.copy_(torch.randn_like(p) * GAIN / max(p.shape[-1], 1) ** 0.5)
    return model.to(dtype)


def our_config(hf: torch.nn.Module) -> TextConfig:
    return TextConfig.from_hf(hf.config.to_dict())


def our_model(hf: torch.nn.Module, dtype: torch.dtype = torch.float32) -> Qwen35Model:
    """Load the transformers state dict (canonical names already) into ninfer."""
    return load_model(our_config(hf), dict(hf.state_dict()), dtype=dtype)


class Sequences:
    """Pools plus a page allocator that hands out deliberately shuffled, non-contiguous pages."""

    def __init__(self, model: Qwen35Model, num_pages: int = 64, num_slots: int = 8, seed: int = 1) -> None:
        cfg, dtype = model.config, model.embed_tokens.weight.dtype
        self.kv = KVPool.for_config(cfg, num_pages, dtype, "cpu")
        self.states = StatePool.for_config(cfg, num_slots, dtype, "cpu")
        g = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(num_pages, generator=g).tolist()
        self.pages: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def open(self, slot: int) -> None:
        self.states.zero_slot(slot)
        self.pages[slot], self.lens[slot] = [], 0

    def _reserve(self, slot: int, total: int) -> None:
        while len(self.pages[slot]) * PAGE_SIZE < total:
            self.pages[slot].append(self.free.pop())

    def step(self, model: Qwen35Model, rows: dict[int, list[int]]) -> torch.Tensor:
        """Run one call with rows {slot: new tokens} (equal lengths). -> hidden [B, q, H]"""
        slots = list(rows)
        for s in slots:
            self._reserve(s, self.lens[s] + len(rows[s]))
        batch = make_batch(
            [rows[s] for s in slots],
            [self.lens[s] for s in slots],
            slots,
            [self.pages[s] for s in slots],
            max_pages=max(len(self.pages[s]) for s in slots) + 1,
        )
        with torch.no_grad():
            hidden = model(batch, self.kv, self.states)
        for s in slots:
            self.lens[s] += len(rows[s])
        return hidden


def hf_to_bf16(hf32: torch.nn.Module) -> torch.nn.Module:
    """A bf16 copy of a transformers model as `from_pretrained(dtype=bfloat16)` gives it: weights in bf16,
    rotary inverse frequencies kept in fp32 (a plain `.to(bf16)` would also round those)."""
    hf = copy.deepcopy(hf32).to(torch.bfloat16)
    rot32, rot = hf32.model.rotary_emb, hf.model.rotary_emb
    rot.inv_freq = rot32.inv_freq.clone()
    rot.original_inv_freq = rot32.original_inv_freq.clone()
    return hf
