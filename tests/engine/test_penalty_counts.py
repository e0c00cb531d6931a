"""Device penalty counts against the host's sparse penalties: the same float32 logits bit for bit,
through owner changes of a lane's row and counts added on the device round after round."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from ninfer.engine.penalty_counts import PenaltyCounts
from ninfer.engine.sampler import ResolvedSampling, RowSampler, _penalized

V = 300


@dataclass
class Row:
    slot: int
    sampler: RowSampler


def _sampler(freq: float, pres: float, seed: int) -> RowSampler:
    return RowSampler(ResolvedSampling(1.0, 1.0, 0, 0.0, pres, freq, seed))


@pytest.mark.parametrize("every_row", [False, True], ids=["some-rows", "every-row"])
def test_penalized_logits_equal_the_host_path_round_after_round(every_row: bool) -> None:
    g = torch.Generator().manual_seed(0)
    counts = PenaltyCounts(rows=4, device=torch.device("cpu"))
    knobs = [(1.5, 0.0), (0.0, 1.5), (0.2 if every_row else 0.0, 0.0), (0.3, 0.7)]
    rows = [Row(10 * i, _sampler(f, p, i)) for i, (f, p) in enumerate(knobs)]
    for r in rows[:2]:  # committed before their first decode round (a prompt's first token)
        r.sampler.observe(int(torch.randint(V, (1,), generator=g)))
    for rnd in range(12):
        if rnd == 6:  # a new request on lane 1: its row is rewritten from its own counts
            rows[1] = Row(10, _sampler(0.9, 0.2, 99))
            rows[1].sampler.observe(3)
        logits = torch.randn(len(rows), V, generator=g) * 4
        logits[0, 5] = float("-inf")  # masked-out entries stay -inf
        got, counted = counts.penalize(logits, rows)
        want = _penalized(logits, [r.sampler for r in rows])
        assert torch.equal(got, want), rnd
        tokens = torch.randint(V // 10, (len(rows),), generator=g)  # repeats: counts above 1
        counts.add(counted, tokens)
        for r, t in zip(rows, tokens.tolist(), strict=True):
            r.sampler.observe(t)


def test_no_penalized_row_leaves_the_logits_alone() -> None:
    counts = PenaltyCounts(rows=2, device=torch.device("cpu"))
    logits = torch.randn(2, V)
    out, counted = counts.penalize(logits, [Row(0, _sampler(0.0, 0.0, 1)), Row(1, _sampler(0.0, 0.0, 2))])
    assert out is logits and counted is None and counts.counts is None


def test_more_lanes_than_rows_is_refused() -> None:
    counts = PenaltyCounts(rows=1, device=torch.device("cpu"))
    counts.penalize(torch.zeros(1, V), [Row(0, _sampler(1.0, 0.0, 1))])
    with pytest.raises(RuntimeError, match="more than 1 lanes"):
        counts.penalize(torch.zeros(1, V), [Row(4, _sampler(1.0, 0.0, 1))])
