"""Verification rules: greedy matching equals plain greedy decoding; rejection sampling reproduces the
target's sequential distribution (chi-square over two-token sequences), also with a reduced-vocabulary
draft and with deterministic drafts."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import pytest
import torch

from ninfer.engine.sampler import RowSampler, SamplingOverrides, resolve_sampling
from ninfer.engine.speculative.rejection import distribution, propose, verify
from ninfer.engine.types import SamplingParams

V = 5
Logits = Callable[[list[int]], torch.Tensor]


def _logits_fn(offset: int, scale: float, keep: int = V) -> Logits:
    """A deterministic 'model': logits over V tokens as a function of the token prefix."""

    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def f(prefix: list[int]) -> torch.Tensor:
        key = tuple(prefix)
        if key not in cache:
            cache[key] = _make(key)
        return cache[key]

    def _make(prefix: tuple[int, ...]) -> torch.Tensor:
        seed = offset + sum((t + 1) * 7**i for i, t in enumerate(prefix))
        x = scale * torch.randn(V, generator=torch.Generator().manual_seed(seed))
        x[keep:] = float("-inf")  # a reduced head has no rows for these ids
        return x

    return f


def _sampler(seed: int, **knobs: float | int) -> RowSampler:
    params = resolve_sampling(SamplingParams(seed=seed, **knobs), None, SamplingOverrides())
    return RowSampler(params)


def _round(s: RowSampler, emitted: list[int], k: int, target: Logits, draft: Logits | None) -> list[int]:
    """One speculative round after `emitted` (already observed by `s`); returns the committed tokens."""
    drafts: list[int] = []
    qs: list[torch.Tensor] = []
    for _ in range(k):
        if draft is None:  # deterministic drafts: the draft model's argmax
            drafts.append(int(torch.argmax(_logits_fn(99, 1.0)(emitted + drafts))))
            continue
        d, q = propose(s, draft(emitted + drafts), drafts)
        drafts.append(d)
        assert q is not None
        qs.append(q)
    rows = torch.stack([target(emitted + drafts[:i]) for i in range(k + 1)])  # [k+1, V]
    verdict = verify(s, rows, drafts, torch.stack(qs) if qs else None)
    assert verdict.tokens[: verdict.accepted] == drafts[: verdict.accepted]
    return verdict.tokens


def _chi2_pvalue(observed: Counter, expected: dict[tuple[int, int], float], n: int) -> float:
    big = {c: e * n for c, e in expected.items() if e * n >= 5}
    rest_e = n - sum(big.values())
    rest_o = n - sum(observed[c] for c in big)
    chi2 = sum((observed[c] - e) ** 2 / e for c, e in big.items())
    dof = len(big) - 1
    if rest_e >= 5:
        chi2 += (rest_o - rest_e) ** 2 / rest_e
        dof += 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(chi2 / 2)))


def _joint(target: Logits, knobs: dict) -> dict[tuple[int, int], float]:
    s = _sampler(0, **knobs)
    p1 = distribution(s, target([]), [])
    out = {}
    for a in range(V):
        s.counts = {a: 1}
        p2 = distribution(s, target([a]), [])
        for b in range(V):
            out[(a, b)] = float(p1[a] * p2[b])
    return out


def _sample_pairs(n: int, k: int, target: Logits, draft: Logits | None, knobs: dict) -> Counter:
    s = _sampler(1234, **knobs)
    pairs: Counter = Counter()
    for _ in range(n):
        s.counts = {}
        emitted: list[int] = []
        while len(emitted) < 2:
            for t in _round(s, emitted, k, target, draft):
                emitted.append(t)
                s.observe(t)
        pairs[(emitted[0], emitted[1])] += 1
    return pairs


CASES = {
    "full-draft-topk-penalty": (3, _logits_fn(7, 1.0), dict(temperature=0.8, top_k=4, frequency_penalty=0.7)),
    "reduced-draft-topp-minp": (2, _logits_fn(7, 1.0, keep=3), dict(temperature=1.0, top_p=0.9, min_p=0.05)),
    "deterministic-drafts": (4, None, dict(temperature=1.3, presence_penalty=0.5)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rejection_sampling_reproduces_the_target(case: str) -> None:
    k, draft, knobs = CASES[case]
    target = _logits_fn(1, 1.5)
    n = 3000
    pairs = _sample_pairs(n, k, target, draft, knobs)
    expected = _joint(target, knobs)
    impossible = {c for c, e in expected.items() if e == 0.0}
    assert not impossible & set(pairs), "a token the target's filters exclude was emitted"
    assert _chi2_pvalue(pairs, expected, n) > 1e-3


def test_the_statistic_detects_a_biased_sampler() -> None:
    """Negative control: always accepting the drafts (sampling q) is rejected by the same test."""
    target, draft = _logits_fn(1, 1.5), _logits_fn(7, 1.0)
    knobs = dict(temperature=1.0)
    s = _sampler(5, **knobs)
    pairs: Counter = Counter()
    n = 3000
    for _ in range(n):
        s.counts = {}
        a, _ = propose(s, draft([]), [])
        s.observe(a)
        b, _ = propose(s, draft([a]), [])
        pairs[(a, b)] += 1
    assert _chi2_pvalue(pairs, _joint(target, knobs), n) < 1e-6


def test_greedy_verification_equals_plain_greedy_with_penalties() -> None:
    target = _logits_fn(3, 2.0)
    knobs = dict(temperature=0.0, frequency_penalty=1.5, presence_penalty=0.5)
    ref = _sampler(0, **knobs)
    plain: list[int] = []
    for _ in range(6):  # plain greedy decoding, one token at a time
        t = ref.sample(target(plain))
        plain.append(t)
        ref.observe(t)
    for wrong_at in (None, 0, 2, 5):
        drafts = list(plain[:5])
        if wrong_at is not None and wrong_at < 5:
            drafts[wrong_at] = (drafts[wrong_at] + 1) % V
        s = _sampler(0, **knobs)
        rows = torch.stack([target(drafts[:i]) for i in range(6)])
        verdict = verify(s, rows, drafts)
        n_ok = 5 if wrong_at is None or wrong_at >= 5 else wrong_at
        assert verdict.accepted == n_ok
        assert verdict.tokens == plain[: n_ok + 1]
        assert s.counts == {}  # verification leaves the request's penalty counts alone


def test_seeded_rounds_are_reproducible() -> None:
    target, draft = _logits_fn(1, 1.5), _logits_fn(7, 1.0)
    knobs = dict(temperature=0.9, top_k=3)
    runs = [_sample_pairs(50, 3, target, draft, knobs) for _ in range(2)]
    assert runs[0] == runs[1]
    assert math.isclose(sum(runs[0].values()), 50)


def test_batched_greedy_match_equals_per_row_verification() -> None:
    from ninfer.engine.speculative.rejection import match_greedy

    target = _logits_fn(4, 2.0)
    s = _sampler(0, temperature=0.0)
    for drafts in ([0, 1, 2], [3, 3, 3], [4, 0, 1]):
        rows = torch.stack([target(drafts[:i]) for i in range(4)])
        assert match_greedy(rows.argmax(-1).tolist(), drafts) == verify(s, rows, drafts)
