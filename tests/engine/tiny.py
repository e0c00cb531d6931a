"""A tiny random hybrid model (3 GDN layers + 1 attention layer) and engine builders for tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ninfer.artifact.shapes import text_shapes
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.model.config import FULL, LINEAR, TextConfig
from ninfer.model.weights import load_model

QWEN_VOCAB = 248320  # the released embedding rows (the tokenizer has 248077 ids)


def tiny_config(vocab_size: int = 512) -> TextConfig:
    return TextConfig(
        family="qwen3_5",
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=4,
        layer_types=(LINEAR, LINEAR, LINEAR, FULL),
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        intermediate_size=64,
        mrope_section=(1, 1, 0),
        eos_token_ids=(vocab_size - 2, vocab_size - 1) if vocab_size < 248046 else (248046, 248044),
    )


def _tensor(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    # Long GDN memory (decay exp(-A * softplus(a + dt_bias)) close to 1 per token), so that
    # outputs depend on recurrent state from far back and a wrong slot shows up in the tokens.
    if name.endswith("linear_attn.A_log"):
        return torch.empty(shape).uniform_(0.01, 0.1, generator=g).log_()
    if name.endswith("linear_attn.dt_bias"):
        return -2.0 + 0.1 * torch.randn(shape, generator=g)
    if name.endswith("linear_attn.norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=g)
    if "norm" in name:
        return 0.1 * torch.randn(shape, generator=g)
    if name == "lm_head.weight":  # large logits: sharp, well separated distributions
        return 2.0 * torch.randn(shape, generator=g)
    return 0.3 * torch.randn(shape, generator=g)


def tiny_model(vocab_size: int = 512, seed: int = 0) -> Any:
    cfg = tiny_config(vocab_size)
    g = torch.Generator().manual_seed(seed)
    tensors = {n: _tensor(n, tuple(s), g) for n, s in text_shapes(cfg).items()}
    return load_model(cfg, tensors, torch.float32, "cpu")


def make_engine(model: Any, **kw: Any) -> Engine:
    base = EngineConfig(max_concurrency=8, max_pending=16, max_context=256, prefill_chunk=64)
    return Engine(model, replace(base, **kw)).start()
