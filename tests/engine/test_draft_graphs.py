"""MTP draft graphs on the CPU (graphs.EagerCapture stands in for CUDA graphs): the graphed greedy
proposal equals the eager one token for token (k = 1..5, batch 1 and 8, mixed pending counts, after
prefill and after partially accepted rounds, full and proposal head); sampled rows and long pending
runs take the eager path; the engine's greedy outputs with draft graphs equal spec off; the engine
captures the proposal graphs through the step's one graph manager (one pool, one GraphStats)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from ninfer.engine import engine as engine_module
from ninfer.engine.graphs import EagerCapture
from ninfer.engine.plan import DecodeRow, SlotOp
from ninfer.engine.sampler import RowSampler, SamplingOverrides, resolve_sampling
from ninfer.engine.speculative.mtp import MTPDrafter, rope_positions
from ninfer.engine.types import SamplingParams
from tests.speculative.helpers import PROMPTS, draft_head, engine, mtp_model, request, run_batch

CPU = torch.device("cpu")
PAGES_PER_LANE = 2
LANES = 8


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return mtp_model(0)


@pytest.fixture(scope="module")
def head(model):
    return draft_head(model)


def _sampler(temperature: float = 0.0) -> RowSampler:
    params = SamplingParams(temperature=temperature, seed=7)
    return RowSampler(resolve_sampling(params, None, SamplingOverrides()))


def _drafter(model, head, k: int, cuda_graph: bool) -> MTPDrafter:
    d = MTPDrafter(
        model, 1 + LANES * PAGES_PER_LANE, LANES, PAGES_PER_LANE + 1, torch.float32, CPU, head,
        vocab_limit=500, draft_tokens=k, max_batch=LANES,
    )  # fmt: skip
    if cuda_graph:
        backend = EagerCapture()
        stats = d.capture_graphs(backend)
        assert (
            stats is not None
            and stats.error is None
            and backend.captured == [(b, 1) for b in range(LANES, 0, -1)]
        )
        assert backend.segments == [k] * LANES  # one graph per draft step, launched while the last runs
    return d


@dataclass
class Lane:
    slot: int
    pages: list[int]
    token: int
    position: int


class Twin:
    """An eager and a graphed drafter driven through the same prefill / round / commit history."""

    def __init__(self, model, head, k: int, b: int, seed: int) -> None:
        self.k, self.rng = k, random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.h = model.config.hidden_size
        self.eager, self.graphed = _drafter(model, head, k, False), _drafter(model, head, k, True)
        self.replays = 0
        inner = self.graphed.graphs.run

        def counted(lanes):
            self.replays += 1
            return inner(lanes)

        self.graphed.graphs.run = counted
        # lane 0 sits on page 0, which graph capture scribbled on: real writes come first
        self.lanes = [
            Lane(i, [i * PAGES_PER_LANE + j for j in range(PAGES_PER_LANE)], 0, 0) for i in range(b)
        ]

    def feed(self, lane: Lane, tokens: list[int], catch_up: bool) -> None:
        hidden = torch.randn(len(tokens), self.h, generator=self.gen)  # [q, H] trunk rows
        rope = rope_positions([lane.position], len(tokens), CPU)[:, 0]  # [3, q]
        for d in (self.eager, self.graphed):
            d.after_forward(lane.slot, lane.position, tokens, hidden, rope, lane.pages, catch_up)
        lane.position += len(tokens)

    def prefill(self, lane: Lane, n: int) -> None:
        toks = [self.rng.randrange(1, 500) for _ in range(n + 1)]
        self.feed(lane, toks[:n], catch_up=True)
        lane.token = toks[n]

    def rows(self, lanes: list[Lane], samplers: list[RowSampler] | None = None) -> list[DecodeRow]:
        samplers = samplers or [_sampler() for _ in lanes]
        return [
            DecodeRow(i, ln.token, ln.position, ln.slot, ln.pages, s)
            for i, (ln, s) in enumerate(zip(lanes, samplers, strict=True))
        ]

    def round(self, lanes: list[Lane], commits: list[int]) -> list[list[int]]:
        """Propose on both; then commit commits[i] of lane i's k+1 verified inputs."""
        want = [p.tokens for p in self.eager.propose(self.rows(lanes), self.k)]
        got = [p.tokens for p in self.graphed.propose(self.rows(lanes), self.k)]
        assert got == want
        for ln, d, c in zip(lanes, want, commits, strict=True):
            inputs = [ln.token, *d]
            self.feed(ln, inputs[:c], catch_up=False)
            ln.token = self.rng.randrange(1, 500)  # the target's own token after the accepted run
        return want


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("b", [1, 8])
@pytest.mark.parametrize("reduced", [False, True], ids=["full-head", "proposal-head"])
def test_graphed_proposal_equals_eager(model, head, k: int, b: int, reduced: bool) -> None:
    t = Twin(model, head if reduced else None, k, b, seed=100 * k + b)
    for i, ln in enumerate(t.lanes):
        t.prefill(ln, 5 + 7 * i)
    rounds = 6
    for r in range(rounds):  # commits vary per lane and round: every pending count 1..k+1 occurs
        t.round(t.lanes, [1 + (i + r) % (k + 1) for i in range(b)])
    assert t.replays == rounds


def test_sampled_rows_and_long_pending_runs_take_the_eager_path(model, head) -> None:
    k = 3
    t = Twin(model, head, k, 4, seed=3)
    for ln in t.lanes:
        t.prefill(ln, 9)
    t.round(t.lanes, [4, 2, 1, 3])
    assert t.replays == 1
    samplers = [_sampler(), _sampler(0.8), _sampler(), _sampler()]
    want = t.eager.propose(t.rows(t.lanes, samplers), k)
    samplers = [_sampler(), _sampler(0.8), _sampler(), _sampler()]
    got = t.graphed.propose(t.rows(t.lanes, samplers), k)
    assert t.replays == 1  # one sampled row: the whole round runs eagerly
    assert [p.tokens for p in got] == [p.tokens for p in want]
    assert got[1].probs is not None and torch.equal(got[1].probs, want[1].probs)
    for ln in t.lanes:
        t.feed(ln, [ln.token, 11, 12, 13], catch_up=False)
        t.feed(ln, [14], catch_up=False)  # a plain fallback step: k + 2 pending rows
        ln.token = 15
    t.round(t.lanes, [1, 2, 3, 4])
    assert t.replays == 1
    t.round(t.lanes, [4, 4, 1, 2])  # back to at most k + 1 pending rows
    assert t.replays == 2


def test_slot_copies_mirror_pending_rows(model) -> None:
    """A checkpoint copy taken before a round continues exactly like the original slot."""
    k = 2
    t = Twin(model, None, k, 2, seed=9)
    a, spare = t.lanes
    t.prefill(a, 12)
    t.round([a], [3])
    for d in (t.eager, t.graphed):
        d.slot_op(SlotOp(dst=spare.slot, src=a.slot))
    twin = Lane(spare.slot, a.pages, a.token, a.position)
    first = t.round([a], [2])
    assert t.round([twin], [2]) == first
    for d in (t.eager, t.graphed):
        d.slot_op(SlotOp(dst=spare.slot))
    assert t.graphed.pending[spare.slot].tokens == ()


def test_no_graphs_without_a_backend_or_k(model) -> None:
    d = MTPDrafter(model, 4, 2, 2, torch.float32, CPU, draft_tokens=None)
    assert d.capture_graphs(EagerCapture()) is None and d.graphs is None
    d = MTPDrafter(model, 4, 2, 2, torch.float32, CPU, draft_tokens=2)
    assert d.capture_graphs(None) is None and d.graphs is None


@pytest.fixture(scope="module")
def baseline(model) -> list[list[int]]:
    eng = engine(model)
    try:
        return [t for t, _, _ in run_batch(eng, [request(p) for p in PROMPTS])]
    finally:
        eng.shutdown(5)


@pytest.mark.parametrize(("k", "reduced"), [(1, False), (3, True), (5, False)])
def test_engine_with_draft_graphs_equals_spec_off(model, head, baseline, monkeypatch, k, reduced) -> None:
    monkeypatch.setattr(engine_module, "default_capture", lambda device: EagerCapture())
    eng: Any = engine(model, head if reduced else None, spec_method="mtp", lm_head_draft=reduced,
                      draft_tokens=k)  # fmt: skip
    try:
        assert eng.wait_ready(120)  # the runner's graph manager captured the proposal graphs
        drafter = eng.spec.drafter
        assert drafter.graphs is not None and drafter.graph_stats.batch_sizes == tuple(range(1, 9))
        replays = []
        inner = drafter.graphs.run
        drafter.graphs.run = lambda lanes: replays.append(len(lanes)) or inner(lanes)
        out = run_batch(eng, [request(p) for p in PROMPTS])
        assert [t for t, _, _ in out] == baseline
        assert replays and max(replays) > 1
    finally:
        eng.shutdown(5)


def test_one_manager_captures_every_graph_into_one_pool(model, monkeypatch) -> None:
    """The step's graphs and the drafter's proposal graphs come from one manager: one backend, one
    pool, and every captured shape (verify, decode, prefill, draft) listed in the one GraphStats."""
    pools: list[object] = []

    class OnePool(EagerCapture):
        def new_pool(self) -> object:
            pools.append(object())
            return pools[-1]

    backend = OnePool()
    monkeypatch.setattr(engine_module, "default_capture", lambda device: backend)
    k = 2
    eng: Any = engine(model, spec_method="mtp", draft_tokens=k)
    try:
        assert eng.wait_ready(120)
        stats = eng.graph_stats()
        drafter = eng.spec.drafter
    finally:
        eng.shutdown(5)
    sizes = list(range(LANES, 0, -1))
    assert len(pools) == 1
    assert stats is not None and stats.error is None and stats.prefill_error is None
    assert stats.verify_batch_sizes == stats.batch_sizes == tuple(range(1, LANES + 1))
    assert stats.families["draft"].batch_sizes == tuple(range(1, LANES + 1))
    assert stats.families["draft"].error is None and drafter.graph_stats is stats.families["draft"]
    assert drafter.graphs is not None and drafter.graphs.manager is eng.runner.graphs
    n = 2 * LANES
    assert backend.captured[:n] == [(b, k + 1) for b in sizes] + [(b, 1) for b in sizes]
    assert sorted(backend.captured[n:-LANES]) == sorted(stats.prefill_shapes)
    assert backend.captured[-LANES:] == [(b, 1) for b in sizes]  # the proposal graphs, last
    assert stats.as_dict()["families"]["draft"]["batch_sizes"] == tuple(range(1, LANES + 1))
