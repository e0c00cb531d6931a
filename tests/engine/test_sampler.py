"""Sampling: resolution order, penalties, and the top-k/top-p/min-p support against transformers."""

from __future__ import annotations

import pytest
import torch

from ninfer.engine.sampler import (
    MIN_TEMPERATURE,
    RowSampler,
    SamplingOverrides,
    batch_probs,
    resolve_sampling,
    sample_rows,
)
from ninfer.engine.types import SamplingParams

PRESET = {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "presence_penalty": 0.0}


def test_resolution_order() -> None:
    r = resolve_sampling(SamplingParams(), PRESET, SamplingOverrides())
    assert (r.temperature, r.top_p, r.top_k, r.frequency_penalty) == (1.0, 0.95, 20, 0.0)
    over = SamplingOverrides(temperature=0.5, top_k=5, seed=7)
    r = resolve_sampling(SamplingParams(), PRESET, over)
    assert (r.temperature, r.top_k, r.top_p, r.seed) == (0.5, 5, 0.95, 7)
    r = resolve_sampling(SamplingParams(temperature=0.9, seed=3), PRESET, over)
    assert (r.temperature, r.top_k, r.seed) == (0.9, 5, 3)
    r = resolve_sampling(SamplingParams(temperature=0.9), PRESET, SamplingOverrides(greedy=True))
    assert r.temperature == 0.0
    a = resolve_sampling(SamplingParams(), PRESET, SamplingOverrides())
    b = resolve_sampling(SamplingParams(), PRESET, SamplingOverrides())
    assert a.seed != b.seed  # a fresh random seed per request
    with pytest.raises(ValueError, match="repetition_penalty"):
        resolve_sampling(SamplingParams(), {**PRESET, "repetition_penalty": 1.1}, SamplingOverrides())
    with pytest.raises(ValueError, match="top_p"):
        resolve_sampling(SamplingParams(top_p=-0.1), PRESET, SamplingOverrides())


def test_penalties_follow_openai_formula() -> None:
    params = resolve_sampling(
        SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.25, seed=0),
        None,
        SamplingOverrides(),
    )
    s = RowSampler(params)
    for t in (3, 3, 5):
        s.observe(t)
    logits = torch.randn(10, generator=torch.Generator().manual_seed(0))
    want = logits.clone()
    want[3] -= 2 * 0.25 + 0.5
    want[5] -= 1 * 0.25 + 0.5
    assert torch.equal(s.adjust(logits), want)


@pytest.mark.parametrize(
    ("temp", "top_k", "top_p", "min_p"),
    [(1.0, 0, 1.0, 0.0), (0.7, 20, 1.0, 0.0), (1.0, 0, 0.8, 0.0), (0.6, 50, 0.9, 0.05), (1.3, 0, 1.0, 0.1)],
)
def test_distribution_matches_transformers(temp, top_k, top_p, min_p) -> None:
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    procs = LogitsProcessorList([TemperatureLogitsWarper(temp)])
    if top_k:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    if min_p:
        procs.append(MinPLogitsWarper(min_p))
    params = resolve_sampling(
        SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=0),
        None,
        SamplingOverrides(),
    )
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        logits = 3 * torch.randn(1000, generator=g)
        ref = torch.softmax(procs(torch.zeros(1, 1, dtype=torch.long), logits[None].clone())[0], -1)
        ours = RowSampler(params).probs(logits)
        ours = ours / ours.sum()
        assert torch.equal(ours > 0, ref > 0)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-7)


def test_seeded_sampling_is_reproducible_and_greedy_is_argmax() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(2))
    p = resolve_sampling(SamplingParams(temperature=1.0, seed=11), None, SamplingOverrides())
    a, b = RowSampler(p), RowSampler(p)
    assert [a.sample(r) for r in logits] == [b.sample(r) for r in logits]
    g = resolve_sampling(SamplingParams(temperature=0.0), None, SamplingOverrides())
    assert [RowSampler(g).sample(r) for r in logits] == logits.argmax(-1).tolist()


@pytest.mark.parametrize("temp", [1e-40, 5e-324, -0.0, 0.0])
def test_temperatures_below_float32_normals_are_greedy(temp: float) -> None:
    r = resolve_sampling(SamplingParams(temperature=temp, seed=1), PRESET, SamplingOverrides())
    assert r.temperature == 0.0 and str(r.temperature) == "0.0"
    for bad in (-1e-40, float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            resolve_sampling(SamplingParams(temperature=bad), PRESET, SamplingOverrides())


@pytest.mark.parametrize("temp", [MIN_TEMPERATURE, 1e-30, 1e-10])
def test_tiny_temperatures_keep_probabilities_finite(temp: float) -> None:
    """A positive temperature just above the greedy floor: dividing the raw logits would
    overflow (logit 30 / 1e-38 > float32 max) and softmax would give NaN; the distribution is
    instead finite and all its mass is on the argmax, in the row and the batched sampler."""
    g = torch.Generator().manual_seed(3)
    logits = 30 * torch.randn(4, 500, generator=g)
    logits[1, 7] = 1e4  # a large logit overflows even at moderate temperatures
    params = resolve_sampling(SamplingParams(temperature=temp, seed=5), None, SamplingOverrides())
    assert params.temperature == temp
    samplers = [RowSampler(params) for _ in range(4)]
    for i, row in enumerate(logits):
        probs = samplers[i].probs(row)
        assert torch.isfinite(probs).all()
        assert probs.argmax() == row.argmax() and probs.sum() == probs.max() == 1.0
    batched = batch_probs(logits, samplers)
    assert torch.isfinite(batched).all() and torch.equal(batched.argmax(-1), logits.argmax(-1))
    assert [s.sample(row) for s, row in zip(samplers, logits, strict=True)] == logits.argmax(-1).tolist()
    assert sample_rows(logits, samplers) == logits.argmax(-1).tolist()


@pytest.mark.parametrize("top_p", [0.0, -0.0, 1e-300])
def test_top_p_zero_keeps_only_the_most_probable_token(top_p: float) -> None:
    """top_p is a finite number in [0, 1] by the contract; at 0 the nucleus is the top token."""
    logits = torch.randn(3, 200, generator=torch.Generator().manual_seed(4))
    params = resolve_sampling(SamplingParams(temperature=1.0, top_p=top_p, seed=9), None, SamplingOverrides())
    samplers = [RowSampler(params) for _ in range(3)]
    for s, row in zip(samplers, logits, strict=True):
        probs = s.probs(row)
        assert torch.count_nonzero(probs) == 1 and probs.argmax() == row.argmax()
        assert s.sample(row) == row.argmax()
    batched = batch_probs(logits, samplers)
    assert torch.equal(torch.count_nonzero(batched, dim=-1), torch.ones(3, dtype=torch.int64))
    assert sample_rows(logits, samplers) == logits.argmax(-1).tolist()
