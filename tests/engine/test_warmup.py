"""Prefill warm-up before ready: the chunk set reaches every length class, and running it leaves
no trace in what requests compute (same tokens as an engine that never warmed up)."""

from __future__ import annotations

from typing import Any

import torch

from ninfer.engine.plan import PrefillPlan
from ninfer.engine.types import GenerationRequest, SamplingParams
from ninfer.engine.warmup import SMALL_LIMIT, warm_prefill, warm_sampling, warmup_chunks, warmup_samplers
from tests.engine.tiny import make_engine


def test_chunk_set_covers_every_length_class() -> None:
    chunks = warmup_chunks(prefill_chunk=1024, max_context=4096)
    fresh = {c.length for c in chunks if c.start == 0}
    assert set(range(1, SMALL_LIMIT + 1)) <= fresh  # unrolled small steps and both attention paths
    for p in (64, 128, 256, 512, 1024):  # == 1 and divisibility-by-16 classes around each power of two
        assert {p - 1, p} <= fresh
    history = {(c.start, c.length) for c in chunks if c.start > 0}
    assert (1024, 1) in history and (1024, 1024) in history and (100, 17) in history
    assert all(c.start + c.length <= 4096 for c in chunks)
    assert all(c.start + c.length <= 200 for c in warmup_chunks(prefill_chunk=64, max_context=200))


def _prompt(n: int, salt: int) -> tuple[int, ...]:
    return tuple((i * 31 + salt * 7 + 3) % 500 + 1 for i in range(n))


def _run(engine: Any) -> list[list[int]]:
    reqs = [
        GenerationRequest(
            f"r{i}", _prompt(5 + 37 * i, i), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        )
        for i in range(4)
    ]
    handles = [engine.submit(engine.reserve(), r) for r in reqs]
    out = []
    for h in handles:
        tokens, _ = h.result(120)
        out.append(tokens)
        h.ticket.release()
    return out


def test_warmed_engine_computes_what_a_cold_one_does(small_model: Any) -> None:
    cold = make_engine(small_model, kv_capacity=2048, prefill_warmup=False)
    try:
        want = _run(cold)
    finally:
        cold.shutdown()
    warm = make_engine(small_model, kv_capacity=2048, prefill_warmup=True)
    try:
        assert warm.wait_ready(120)
        assert warm.warmup is not None and warm.warmup.chunks == len(warmup_chunks(64, 256))
        assert warm.warmup.thin and len(warm.model.layers) == len(small_model.config.layer_types)
        assert _run(warm) == want
        assert warm.late_compiles() == 0  # the CPU compiles nothing
    finally:
        warm.shutdown()
    assert cold.warmup is None


def test_warm_up_chunks_run_the_eager_forward() -> None:
    """A short chunk whose pages do not cover a bucket's padding runs eagerly after ready, so
    warm-up compiles the eager path of every length (the bucket graphs were captured before)."""
    plans: list[PrefillPlan] = []
    warm_prefill(plans.append, warmup_chunks(64, 256), vocab=500)
    assert plans and all(not p.cuda_graph for p in plans)


def test_sampling_warm_up_takes_every_sampling_path() -> None:
    kinds = warmup_samplers(torch.device("cpu"))
    params = [s.params for s in kinds]
    assert any(p.temperature == 0.0 for p in params) and any(p.temperature > 0.0 for p in params)
    assert any(p.top_k > 0 and p.top_p < 1.0 for p in params) and any(p.min_p > 0.0 for p in params)
    assert any(s.penalized and s.counts for s in kinds)
    assert any(s.logprobs for s in kinds) and any(s.constraint is not None for s in kinds)
    # batch 1 for each kind and one batch of 8, each with and without an in-graph argmax
    assert warm_sampling(torch.device("cpu"), vocab=300, max_batch=8) == 2 * (len(kinds) + 8)


def test_one_layer_per_kind_runs_each_kind_once_and_restores_the_model(small_model: Any) -> None:
    kinds = small_model.config.layer_types
    layers, index = list(small_model.layers), list(small_model.pool_index)
    with small_model.one_layer_per_kind() as thin:
        assert thin
        assert [layer.kind for layer in small_model.layers] == sorted(set(kinds), key=kinds.index)
        assert all(
            small_model.layers[i] is layers[kinds.index(layer.kind)]
            for i, layer in enumerate(small_model.layers)
        )
    assert list(small_model.layers) == layers and small_model.pool_index == index
    small_model.capture_layers = (1,)  # a DFlash drafter reads layer outputs: the model stays whole
    try:
        with small_model.one_layer_per_kind() as thin:
            assert not thin and list(small_model.layers) == layers
    finally:
        small_model.capture_layers = ()
