"""The oracle drafter drafts through forwards of the verification's own shape, so a fully right
oracle is accepted in full even where the decode (q = 1) path would choose differently."""

from __future__ import annotations

import torch

from ninfer.engine.plan import DecodeRow
from ninfer.engine.sampler import RowSampler, SamplingOverrides, resolve_sampling
from ninfer.engine.speculative.oracle import OracleDrafter
from ninfer.engine.speculative.rejection import match_greedy
from ninfer.engine.step_io import StepOut, StepRows
from ninfer.engine.types import SamplingParams

VOCAB = 50


def _next(token: int, position: int) -> int:
    """The fake target's greedy choice after `token` at `position` (q = k + 1 forwards)."""
    return (7 * token + position + 3) % VOCAB


class FakeTarget:
    """A forward whose verify-shaped (q > 1) choices follow `_next` and whose q = 1 choices differ
    (as near-tied logits can between two GEMM shapes); records every call."""

    def __init__(self) -> None:
        self.calls: list[StepRows] = []

    def __call__(self, rows: StepRows) -> StepOut:
        self.calls.append(rows)
        b, q = rows.shape
        logits = torch.zeros(b, q, VOCAB)
        for i in range(b):
            for t in range(q):
                choice = _next(rows.tokens[i][t], rows.cache_lens[i] + t)
                logits[i, t, (choice + 1) % VOCAB if q == 1 else choice] = 1.0
        return StepOut(torch.zeros(b, q, 4), logits)


def _rows() -> list[DecodeRow]:
    greedy = RowSampler(resolve_sampling(SamplingParams(temperature=0.0), None, SamplingOverrides()))
    return [DecodeRow(i, 11 + i, 20 + 3 * i, 4 * i, [i], greedy) for i in range(3)]


def test_drafts_equal_what_verification_computes() -> None:
    k = 3
    target = FakeTarget()
    scratch = {4 * i: tuple(4 * i + 1 + j for j in range(k)) for i in range(3)}  # live slot -> k scratch
    oracle = OracleDrafter(scratch.__getitem__, VOCAB, wrong_fraction=0.0)
    oracle.bind(target)
    rows = _rows()
    proposals = oracle.propose(rows, k)

    assert len(target.calls) == k
    for call in target.calls:
        assert call.shape == (3, k + 1)  # the verify shape only
        assert call.slots == [r.slot for r in rows]  # reads the live slots ...
        for r, w in zip(rows, call.writes or [], strict=True):
            assert r.slot not in w and set(w) <= set(scratch[r.slot])  # ... and writes scratch only
    # verification of [token, d_1..d_k] accepts every draft
    verify = target(
        StepRows.for_decode(rows, [[r.token, *p.tokens] for r, p in zip(rows, proposals, strict=True)])
    )
    for i, p in enumerate(proposals):
        verdict = match_greedy(verify.greedy()[i], p.tokens)
        assert verdict.accepted == k and len(verdict.tokens) == k + 1


def test_wrong_fraction_replaces_drafts() -> None:
    oracle = OracleDrafter(lambda slot: (slot + 1, slot + 2), VOCAB, wrong_fraction=1.0, seed=3)
    target = FakeTarget()
    oracle.bind(target)
    rows = _rows()
    right = [_next(r.token, r.cached) for r in rows]
    got = [p.tokens[0] for p in oracle.propose(rows, 2)]
    assert all(g != t for g, t in zip(got, right, strict=True))
