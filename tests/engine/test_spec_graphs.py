"""Speculative rounds with one GDN slot per draft position: a rejected round commits its state with
one slot copy and no extra target forward, and verification replays (B, k+1) graphs (EagerCapture:
the graph bookkeeping without a GPU) with outputs equal to the eager rounds and to spec off."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.graphs import EagerCapture, StepGraphs
from ninfer.engine.runner import Runner
from ninfer.engine.types import GenerationRequest
from tests.speculative.helpers import PROMPTS, mtp_model, prompt, request, run_batch

K = 3
BASE = EngineConfig(max_concurrency=8, max_pending=16, max_context=256, prefill_chunk=64, kv_capacity=2048)


@pytest.fixture(scope="module")
def model() -> Any:
    torch.set_num_threads(1)
    return mtp_model(0)


def _requests(sampled: bool) -> list[GenerationRequest]:
    """Seven prompts plus one whose pages end 4 tokens after it (plain fallback rows in the batch)."""
    reqs = [request(p) for p in PROMPTS[:7]]
    if sampled:  # every other row samples (rejection sampling), the rest are plain greedy
        reqs = [r if i % 2 else request(r.prompt_ids, temperature=0.9, top_k=40, seed=5 + i) for i, r in
                enumerate(reqs)]  # fmt: skip
    return [*reqs, request(prompt(60, 77), max_tokens=4)]


def _run(eng: Engine, reqs: list[GenerationRequest]) -> list[tuple[list[int], Any, Any]]:
    try:
        return run_batch(eng, reqs)
    finally:
        eng.shutdown(5)


class TrunkCalls:
    """Counts the target model's forwards, by where they happen (decode round / settle / other)."""

    def __init__(self, eng: Engine) -> None:
        self.where = "other"
        self.calls: list[tuple[str, int, int, int | None, bool]] = []  # where, B, q, max_kv_len, writes
        model, spec = eng.model, eng.spec
        assert spec is not None
        inner_forward = model.forward

        def forward(batch, kv, states):
            b, q = batch.input_ids.shape
            self.calls.append((self.where, b, q, batch.max_kv_len, batch.write_slots is not None))
            return inner_forward(batch, kv, states)

        model.forward = forward
        self._restore = lambda: model.__dict__.pop("forward")
        inner_decode, inner_settle = spec.decode, spec.settle

        def decode(plan):
            self.where = "decode"
            result = inner_decode(plan)
            self.where = "other"
            return result

        def settle(result, committed):
            self.where = "settle"
            done = inner_settle(result, committed)
            self.where = "other"
            return done

        spec.decode, spec.settle = decode, settle

    def close(self) -> None:
        self._restore()


def test_rejected_rounds_commit_their_state_without_an_extra_forward(model) -> None:
    """MTP drafts of a random head are mostly rejected: every round costs at most one plain and one
    verify forward, settle runs none, and the tokens equal spec off (a wrong GDN state would
    change the tiny long-memory model's greedy continuation)."""
    want = [t for t, _, _ in _run(Engine(model, BASE).start(), _requests(False))]
    eng = Engine(model, replace(BASE, spec_method="mtp", draft_tokens=K))
    calls = TrunkCalls(eng)
    try:
        got = _run(eng.start(), _requests(False))
    finally:
        calls.close()
    assert [t for t, _, _ in got] == want
    drafted = sum(st.speculative["drafted_tokens"] for _, st, _ in got)
    accepted = sum(st.speculative["accepted_tokens"] for _, st, _ in got)
    assert 0 < accepted < drafted  # some rounds accepted drafts, some rejected them
    assert not [c for c in calls.calls if c[0] == "settle"]
    decode = [c for c in calls.calls if c[0] == "decode"]
    verify = [c for c in decode if c[2] > 1]
    assert verify and all(q == K + 1 and writes for _, _, q, _, writes in verify)
    assert all(q == 1 and not writes for _, _, q, _, writes in decode if q == 1)
    assert any(q == 1 for _, _, q, _, _ in decode)  # the fallback row's plain steps
    assert len(decode) <= 2 * len(verify) + 3  # at most one plain forward per round


def _graphed(model: Any, config: EngineConfig) -> tuple[Engine, EagerCapture, list[tuple[int, int]]]:
    """An engine whose runner captures through EagerCapture; returns the replayed (B, q) keys."""
    eng = Engine(model, config)
    backend = EagerCapture()
    eng.runner = Runner(
        model, eng.kv, eng.states, eng.runner.max_pages, torch.device("cpu"), None,
        max_batch=config.max_concurrency, capture=backend, spec=eng.spec,
    )  # fmt: skip
    replays: list[tuple[int, int]] = []
    inner_run = StepGraphs.run

    def run(self, packed, b, q=1, feed=None):
        replays.append((b, q))
        return inner_run(self, packed, b, q, feed)

    eng.runner.capture_graphs()
    graphs = eng.runner.graphs
    assert graphs is not None
    graphs.run = run.__get__(graphs)  # type: ignore[method-assign]
    return eng, backend, replays


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "mixed-sampled"])
@pytest.mark.parametrize("drafter", ["oracle", "mtp"])
def test_verify_graphs_equal_eager_rounds_with_mixed_acceptance(model, drafter: str, sampled: bool) -> None:
    spec = replace(BASE, spec_method="mtp", draft_tokens=K)
    if drafter == "oracle":
        spec = replace(spec, spec_oracle_wrong_fraction=0.4, spec_oracle_seed=3)
    reqs = _requests(sampled)
    want = _run(Engine(model, spec).start(), reqs)  # eager rounds (CPU: no graphs)
    eng, backend, replays = _graphed(model, spec)
    calls = TrunkCalls(eng)
    try:
        got = _run(eng.start(), reqs)
    finally:
        calls.close()
    sizes = range(BASE.max_concurrency, 0, -1)
    assert backend.captured == [(b, K + 1) for b in sizes] + [(b, 1) for b in sizes]
    stats = eng.runner.graph_stats
    assert stats is not None and stats.error is None and stats.verify_q == K + 1
    assert stats.verify_batch_sizes == stats.batch_sizes == tuple(range(1, BASE.max_concurrency + 1))
    assert [t for t, _, _ in got] == [t for t, _, _ in want]
    for (_, a, _), (_, b, _) in zip(got, want, strict=True):
        assert a.speculative == b.speculative
    drafted = sum(st.speculative["drafted_tokens"] for _, st, _ in got)
    accepted = sum(st.speculative["accepted_tokens"] for _, st, _ in got)
    assert accepted < drafted and (accepted > 0 or drafter == "mtp")  # the random MTP head may miss all
    # every target forward of a round replayed a graph: verify (B, k+1) and q = 1 (fallback rows,
    # the oracle's drafting), never an eager batch (those carry a max_kv_len)
    assert {q for _, q in replays} == {1, K + 1}
    in_rounds = [c for c in calls.calls if c[0] != "other"]
    assert in_rounds and all(kv_len is None for _, _, _, kv_len, _ in in_rounds)
    assert not [c for c in calls.calls if c[0] == "settle"]
    if not sampled:
        base = _run(Engine(model, BASE).start(), reqs)
        assert [t for t, _, _ in got] == [t for t, _, _ in base]
