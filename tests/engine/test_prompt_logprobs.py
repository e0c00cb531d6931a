"""Prompt logprobs from the prefill equal the log-softmax of a plain forward's logits over the
prompt (the offline reference loop): across prefill chunks and score blocks, with max_tokens 0,
beside a generating request, and after a prefix-cache hit (the scoring request recomputes)."""

from __future__ import annotations

import pytest
import torch

from ninfer.engine.prompt_logprobs import score_positions
from ninfer.engine.types import GenerationRequest, SamplingParams, StepOutput, TokenLogprob
from ninfer.offline import LLM
from tests.engine.tiny import make_engine


def _check(ref: LLM, prompt: list[int], lps: tuple[TokenLogprob | None, ...], top: int) -> None:
    want = torch.log_softmax(ref.logits(prompt).float(), dim=-1)  # [n, V]
    assert len(lps) == len(prompt) and lps[0] is None
    for i, lp in enumerate(lps[1:], start=1):
        assert lp is not None and lp.token_id == prompt[i]
        assert lp.logprob == pytest.approx(float(want[i - 1, prompt[i]]), abs=2e-4)
        assert len(lp.top) == top
        vals = [v for _, v in lp.top]
        assert vals == pytest.approx(torch.topk(want[i - 1], top).values.tolist(), abs=2e-4)
        assert [float(want[i - 1, t]) for t, _ in lp.top] == pytest.approx(vals, abs=2e-4)


def _outputs(eng, rid: str, prompt: list[int], params: SamplingParams) -> list[StepOutput]:  # type: ignore[no-untyped-def]
    return list(eng.submit(eng.reserve(), GenerationRequest(rid, tuple(prompt), params)))


def test_prompt_logprobs_match_reference(small_model) -> None:
    ref = LLM.from_model(small_model)
    long = [(i * 37 + 5) % 500 + 1 for i in range(150)]  # three 64-token chunks
    short = [(i * 11 + 3) % 500 + 1 for i in range(9)]
    eng = make_engine(small_model, max_concurrency=4, kv_capacity=1024, prefill_chunk=64)
    try:
        warm = _outputs(eng, "w", long, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        assert all(o.prompt_logprobs is None for o in warm)
        handles = [
            eng.submit(eng.reserve(), GenerationRequest(rid, tuple(p), params))
            for rid, p, params in (
                ("a", long, SamplingParams(max_tokens=0, prompt_logprobs=3)),
                ("b", short, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, prompt_logprobs=0)),
                ("c", short, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)),
            )
        ]  # fmt: skip
        outs = [list(h) for h in handles]
        stats = [h.stats for h in handles]
    finally:
        eng.shutdown(5)
    a, b, c = outs
    assert [(o.token_ids, o.finish_reason) for o in a] == [((), "length")]
    assert stats[0].cached_tokens == 0 and stats[0].computed_prefill_tokens == len(long)  # no reuse
    assert stats[0].completion_tokens == 0
    assert a[0].prompt_logprobs is not None
    _check(ref, long, a[0].prompt_logprobs, 3)
    assert b[0].prompt_logprobs is not None and all(o.prompt_logprobs is None for o in b[1:])
    _check(ref, short, b[0].prompt_logprobs, 0)
    assert sum(len(o.token_ids) for o in b) == 4
    assert [t for o in b for t in o.token_ids][:3] == [t for o in c for t in o.token_ids]
    assert all(o.prompt_logprobs is None for o in c)


def test_score_blocks_agree_and_targets_bound() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(50, 8, generator=g)
    hidden = torch.randn(10, 8, generator=g)
    targets = [int(t) for t in torch.randint(0, 50, (9,), generator=g)]
    whole = score_positions(lambda h: h @ w.T, hidden, targets, 4, block=64)
    blocks = score_positions(lambda h: h @ w.T, hidden, targets, 4, block=3)
    # the same ids and ranks; the values within float rounding (a matmul over 3 rows may round
    # differently from one over 10: BLAS picks its kernel by shape)
    assert [(x.token_id, [t for t, _ in x.top]) for x in whole] == [
        (x.token_id, [t for t, _ in x.top]) for x in blocks
    ]
    for a, b in zip(whole, blocks, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
        assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=1e-5)
    ref = torch.log_softmax(hidden @ w.T, dim=-1)
    assert [x.logprob for x in whole] == pytest.approx([float(ref[i, t]) for i, t in enumerate(targets)])
    with pytest.raises(ValueError, match="targets"):
        score_positions(lambda h: h @ w.T, hidden, [*targets, 1, 2], 0)


def test_intake_bounds(small_model) -> None:
    eng = make_engine(small_model, max_concurrency=1, kv_capacity=256)
    try:
        for params, match in (
            (SamplingParams(max_tokens=0), "max_tokens must be >= 1"),
            (SamplingParams(max_tokens=1, prompt_logprobs=21), "prompt_logprobs"),
            (SamplingParams(max_tokens=1, thinking_budget=0), "thinking_budget"),
        ):
            with pytest.raises(ValueError, match=match):
                eng.submit(eng.reserve(), GenerationRequest("x", (1, 2, 3), params))
    finally:
        eng.shutdown(5)


def test_scored_prompts_skip_the_prefill_graphs(small_model) -> None:
    """With captured prefill graphs (EagerCapture), short scored prompts take the eager prefill
    (every position's logits): exact values, and only the unscored prompt replays a graph."""
    from ninfer.engine.config import EngineConfig
    from tests.engine.test_prefill_graphs import _graphed

    ref = LLM.from_model(small_model)
    cfg = EngineConfig(max_concurrency=3, max_pending=8, max_context=256, prefill_chunk=64, kv_capacity=768)
    prompts = [[(i * 17 + s) % 500 + 1 for i in range(n)] for s, n in enumerate((12, 30, 20))]
    engine, _, used = _graphed(small_model, cfg, (16, 32))
    try:
        scored = [
            SamplingParams(max_tokens=1, prompt_logprobs=2),
            SamplingParams(max_tokens=0, prompt_logprobs=1),
        ]
        handles = [
            engine.submit(engine.reserve(), GenerationRequest(f"g{i}", tuple(p), params))
            for i, (p, params) in enumerate(
                zip(prompts, [*scored, SamplingParams(max_tokens=1)], strict=True)
            )
        ]
        outs = [list(h) for h in handles]
    finally:
        engine.shutdown(5)
    for p, out, top in zip(prompts[:2], outs[:2], (2, 1), strict=True):
        assert out[0].prompt_logprobs is not None
        _check(ref, p, out[0].prompt_logprobs, top)
    assert outs[2][0].prompt_logprobs is None
    assert [b for b, _ in used] == [1]  # the unscored prompt alone
