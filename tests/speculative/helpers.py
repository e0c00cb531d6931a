"""Shared pieces of the speculative engine tests: a long-memory tiny model with an MTP head, runners."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise
from typing import Any

import pytest
import torch

from ninfer.artifact.shapes import mtp_shapes, text_shapes
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.speculative.draft_head import DraftHead
from ninfer.engine.types import GenerationRequest, RequestStats, SamplingParams, TokenLogprob
from ninfer.model.weights import load_model
from tests.engine.tiny import _tensor, tiny_config

VOCAB = 512


def mtp_model(seed: int = 0) -> Any:
    """tests/engine's tiny hybrid (long GDN memory, so a wrong state changes tokens) plus an MTP head."""
    cfg = dataclasses.replace(tiny_config(VOCAB), mtp_num_hidden_layers=1)
    g = torch.Generator().manual_seed(seed)
    shapes = {**text_shapes(cfg), **mtp_shapes(cfg)}
    return load_model(cfg, {n: _tensor(n, tuple(s), g) for n, s in shapes.items()}, torch.float32, "cpu")


def draft_head(model: Any, every: int = 3) -> DraftHead:
    """A reduced head over every `every`-th id (stop ids included)."""
    ids = sorted({*range(0, VOCAB, every), *model.config.eos_token_ids})
    t = torch.tensor(ids)
    return DraftHead(t, model.lm_head.weight[t].clone(), VOCAB)


def prompt(n: int, salt: int) -> tuple[int, ...]:
    return tuple((i * 53 + salt * 7 + 3) % 500 + 1 for i in range(n))


PROMPTS = [prompt(9 + 11 * i, i) for i in range(8)]


class TagDetokenizer:
    """Token id t reads as `<t>`: stop strings can straddle token boundaries without a tokenizer."""

    def push(self, ids: Sequence[int]) -> str:
        return "".join(f"<{t}>" for t in ids)

    def flush(self) -> str:
        return ""


def engine(
    model: Any, head: DraftHead | None = None, detok: bool = False, dflash: Any = None, **kw: Any
) -> Engine:
    """An 8-lane engine (max_context 256, chunk 64) as in tests/engine, with the given overrides
    (`head`: the proposal head, `dflash`: the DFlash drafter)."""
    base = EngineConfig(
        max_concurrency=8, max_pending=16, max_context=256, prefill_chunk=64, kv_capacity=2048
    )
    detokenizer = TagDetokenizer if detok else None
    return Engine(model, replace(base, **kw), detokenizer, draft_head=head, dflash=dflash).start()


def request(p: Sequence[int], max_tokens: int = 24, **params: Any) -> GenerationRequest:
    turn = params.pop("turn", None)
    response = params.pop("response", None)
    fields = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, **params}
    return GenerationRequest(
        "r", tuple(p), SamplingParams(**fields), turn_checkpoint=turn, response_checkpoint=response
    )


def run_batch(eng: Any, reqs: Sequence[GenerationRequest]) -> list[tuple[list[int], RequestStats, Any]]:
    """Submit all, then collect: (tokens, stats, last output) per request."""
    handles = [eng.submit(eng.reserve(), r) for r in reqs]
    out = []
    for h in handles:
        with h:
            tokens, last = h.result(120)
            out.append((tokens, h.stats, last))
    return out


def assert_speculation_exact(plain: Any, spec_model: Any, head: DraftHead | None, **spec: Any) -> None:
    """Three prompts through speculation off (`plain`) and on (`spec_model`, `spec` the engine's
    spec fields): the same greedy tokens, every request with speculative rounds."""
    ref, eng = engine(plain, no_prefix_reuse=True), engine(spec_model, head, **spec)
    try:
        reqs = [request(prompt(20 + 7 * i, i), max_tokens=16) for i in range(3)]
        want, got = run_batch(ref, reqs), run_batch(eng, reqs)
        assert [t for t, _, _ in got] == [t for t, _, _ in want]
        assert all(st.speculative["rounds"] > 0 for _, st, _ in got)
    finally:
        ref.shutdown(5)
        eng.shutdown(5)


def run_logprobs(
    eng: Any, reqs: Sequence[GenerationRequest]
) -> list[tuple[list[int], list[TokenLogprob], RequestStats]]:
    """Submit all, then collect: (tokens, logprobs of every output, stats) per request."""
    handles = [eng.submit(eng.reserve(), r) for r in reqs]
    out = []
    for h in handles:
        with h:
            steps = list(h)
            tokens = [t for s in steps for t in s.token_ids]
            out.append((tokens, [lp for s in steps for lp in (s.logprobs or ())], h.stats))
    return out


def assert_same_logprobs(got: Sequence[TokenLogprob], want: Sequence[TokenLogprob]) -> None:
    """Same tokens, logprobs and top alternatives (up to float32 rounding between a verify forward
    and single-token steps); alternatives a grammar masks out (-inf, tied) compare by count."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.token_id == b.token_id
        assert a.logprob == pytest.approx(b.logprob, abs=2e-4)
        fa = [(t, v) for t, v in a.top if v > float("-inf")]
        fb = [(t, v) for t, v in b.top if v > float("-inf")]
        assert len(a.top) == len(b.top) and [t for t, _ in fa] == [t for t, _ in fb]
        assert [v for _, v in fa] == pytest.approx([v for _, v in fb], abs=2e-4)


def check_counters(stats: RequestStats, k: int, backend: str) -> dict:
    c = stats.speculative
    assert c["backend"] == backend and c["draft_window"] == k
    per = c["accepted_per_position"]
    assert len(per) == k and sum(per) == c["accepted_tokens"]
    assert all(a >= b for a, b in pairwise(per)) and all(x <= c["rounds"] for x in per)
    assert c["drafted_tokens"] == k * c["rounds"]
    rest = stats.completion_tokens - 1 - c["fallback_steps"] - c["accepted_tokens"]
    assert rest in (c["rounds"], c["rounds"] - 1), c
    return c
