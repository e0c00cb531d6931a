"""The batched, sync-free sampling path against the per-row `RowSampler` (same seeds, same tokens)."""

from __future__ import annotations

import random

import pytest
import torch

from ninfer.engine.sampler import RowSampler, SamplingOverrides, batch_probs, resolve_sampling, sample_rows
from ninfer.engine.types import SamplingParams

V = 3000


def _params(rng: random.Random, seed: int):
    kind = rng.choice(["greedy", "plain", "top_k", "top_p", "min_p", "all", "penalized"])
    knobs: dict[str, float | int] = {"temperature": rng.choice([0.3, 0.7, 1.0, 1.6])}
    if kind == "greedy":
        knobs["temperature"] = 0.0
    if kind in ("top_k", "all"):
        knobs["top_k"] = rng.choice([1, 2, 20, 500, V, V + 7])
    if kind in ("top_p", "all"):
        knobs["top_p"] = rng.choice([0.1, 0.5, 0.9, 0.999])
    if kind in ("min_p", "all"):
        knobs["min_p"] = rng.choice([0.01, 0.1, 0.5])
    if kind in ("penalized", "all") or rng.random() < 0.3:
        knobs["presence_penalty"] = rng.choice([0.0, 0.4, 1.5])
        knobs["frequency_penalty"] = rng.choice([0.0, 0.3, 2.0])
    return resolve_sampling(SamplingParams(seed=seed, **knobs), None, SamplingOverrides())


def _pair(params, rng: random.Random) -> tuple[RowSampler, RowSampler]:
    a, b = RowSampler(params), RowSampler(params)
    for _ in range(rng.randrange(0, 12)):
        t = rng.randrange(V)
        a.observe(t)
        b.observe(t)
    return a, b


def _logits(b: int, seed: int) -> torch.Tensor:
    x = 4 * torch.randn(b, V, generator=torch.Generator().manual_seed(seed))
    x[:, :50] = x[:, :50].round()  # exact ties, so tie handling is exercised
    return x


@pytest.mark.parametrize("seed", range(6))
def test_batched_tokens_equal_per_row_tokens(seed: int) -> None:
    rng = random.Random(seed)
    b = rng.randrange(1, 9)
    params = [_params(rng, rng.randrange(2**31)) for _ in range(b)]
    pairs = [_pair(p, rng) for p in params]
    for step in range(4):
        logits = _logits(b, 100 * seed + step)
        want = [ref.sample(logits[i]) for i, (ref, _) in enumerate(pairs)]
        got = sample_rows(logits, [fast for _, fast in pairs])
        assert got == want
        for (ref, fast), t in zip(pairs, want, strict=True):
            ref.observe(t)
            fast.observe(t)


def test_batch_probs_equal_per_row_probs() -> None:
    rng = random.Random(7)
    params = [_params(rng, i) for i in range(24)]
    samplers = [RowSampler(p) for p in params]
    logits = _logits(len(samplers), 1)
    got = batch_probs(logits, samplers)
    for i, s in enumerate(samplers):
        if s.params.temperature:
            assert torch.equal(got[i], s.probs(logits[i])), s.params


def test_tokens_do_not_depend_on_batch_composition() -> None:
    p = resolve_sampling(
        SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=5), None, SamplingOverrides()
    )
    g = resolve_sampling(SamplingParams(temperature=0.0), None, SamplingOverrides())
    rows = _logits(3, 9)
    alone = RowSampler(p)
    mixed = RowSampler(p)
    others = [
        RowSampler(resolve_sampling(SamplingParams(temperature=1.2, seed=1), None, SamplingOverrides()))
    ]
    for _ in range(5):
        a = sample_rows(rows[1:2], [alone])[0]
        m = sample_rows(rows, [RowSampler(g), mixed, *others])[1]
        rows = rows.roll(1, dims=0)
        assert a == m


def test_invalid_distribution_raises_like_multinomial() -> None:
    p = resolve_sampling(SamplingParams(temperature=1.0, seed=0), None, SamplingOverrides())
    logits = _logits(2, 3)
    logits[1, 5] = float("nan")
    with pytest.raises(RuntimeError, match="probability tensor"):
        RowSampler(p).sample(logits[1])
    with pytest.raises(RuntimeError, match="probability tensor"):
        sample_rows(logits, [RowSampler(p), RowSampler(p)])
    g = resolve_sampling(SamplingParams(temperature=0.0), None, SamplingOverrides())
    assert sample_rows(logits[:1], [RowSampler(g)]) == [int(logits[0].argmax())]
    assert sample_rows(torch.empty(0, V), []) == []


def test_a_given_argmax_serves_greedy_rows_unless_penalties_change_the_logits() -> None:
    logits = _logits(3, 7)
    greedy = [
        RowSampler(resolve_sampling(SamplingParams(temperature=0.0), None, SamplingOverrides()))
        for _ in range(3)
    ]
    planted = torch.tensor([5, 6, 7])  # not the logits' argmax: shows which one was used
    assert sample_rows(logits, greedy, planted) == [5, 6, 7]
    assert sample_rows(logits, greedy) == logits.argmax(-1).tolist()
    penal = resolve_sampling(SamplingParams(temperature=0.0, presence_penalty=1.5), None, SamplingOverrides())
    rows = [RowSampler(penal) for _ in range(3)]
    for r in rows:
        r.observe(int(logits[0].argmax()))  # the penalty moves row 0's argmax
    want = [s.sample(logits[i]) for i, s in enumerate(rows)]
    assert sample_rows(logits, rows, planted) == want
