"""kv_dtype=int8 through the engine: a quarter of the fp32 page bytes, and greedy output that
agrees with full-precision KV (per-token per-head scales keep the error at the rounding level)."""

from __future__ import annotations

import torch

from ninfer.engine.sizing import page_bytes
from ninfer.engine.types import GenerationRequest, SamplingParams
from tests.engine.tiny import make_engine, tiny_config


def _run(model, kv_dtype):
    eng = make_engine(model, max_concurrency=4, kv_capacity=1024, kv_dtype=kv_dtype, no_prefix_reuse=True)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = [[(i * 37 + s) % 500 + 1 for i in range(n)] for s, n in enumerate((9, 80, 150, 41))]
    handles = [
        eng.submit(eng.reserve(), GenerationRequest(f"r{i}", tuple(p), params)) for i, p in enumerate(prompts)
    ]
    out = [h.result(120)[0] for h in handles]
    kv = eng.kv
    eng.shutdown(5)
    return out, kv


def test_int8_kv_pool_and_greedy_agreement(small_model) -> None:
    want, kv_full = _run(small_model, None)
    got, kv_int8 = _run(small_model, "int8")
    assert kv_full.k[0].dtype == torch.float32 and kv_int8.k[0].dtype == torch.int8
    cfg = tiny_config()
    # int8 values plus one fp32 scale per token and head, for K and V
    assert page_bytes(cfg, torch.int8) == 64 * 2 * cfg.num_key_value_heads * (cfg.head_dim + 4)
    agree = sum(a == b for w, g in zip(want, got, strict=True) for a, b in zip(w, g, strict=True))
    total = sum(len(w) for w in want)
    assert agree / total >= 0.9, f"int8 KV greedy agreement {agree}/{total}"
