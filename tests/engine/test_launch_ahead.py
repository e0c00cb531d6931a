"""Launch-ahead decode (round N+1 fed on the device before round N is committed): the same tokens
as committing every round before the next, with finishes, arrivals, cancels and penalties."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ninfer.engine.engine import Engine
from ninfer.engine.types import GenerationRequest, SamplingParams
from tests.engine.tiny import make_engine as _make


def make_engine(model: Any, **kw: Any) -> Engine:
    return _make(model, **{"kv_capacity": 2048, **kw})


def _prompt(n: int, salt: int) -> tuple[int, ...]:
    return tuple((i * 37 + salt * 11 + 5) % 500 + 1 for i in range(n))


def _requests(stop_id: int | None = None) -> list[GenerationRequest]:
    """Eight rows that finish at different rounds, greedy and seeded; row 2 stops on `stop_id`."""
    reqs = []
    for i in range(8):
        params: dict[str, Any] = {"max_tokens": 6 + 5 * i, "ignore_eos": True}
        if i % 2:
            params |= {"temperature": 0.9, "top_k": 40, "seed": 100 + i}
        else:
            params |= {"temperature": 0.0}
        if i == 2 and stop_id is not None:
            params |= {"stop_token_ids": (stop_id,), "ignore_eos": False}
        reqs.append(GenerationRequest(f"r{i}", _prompt(20 + 3 * i, i), SamplingParams(**params)))
    return reqs


class AheadCount:
    """Counts the engine runner's launches fed by a round still in flight."""

    def __init__(self, engine: Engine) -> None:
        self.fed = 0
        inner = engine.runner.launch

        def launch(plan: Any, feed: Any = None, on_launch: Any = None) -> Any:
            self.fed += feed is not None
            return inner(plan, feed, on_launch)

        engine.runner.launch = launch  # type: ignore[method-assign]


def _run_all(engine: Engine, reqs: list[GenerationRequest]) -> list[tuple[list[int], str | None]]:
    handles = [engine.submit(engine.reserve(), r) for r in reqs]
    out = []
    for h in handles:
        tokens, last = h.result(120)
        out.append((tokens, last.finish_reason))
        h.ticket.release()
    return out


def test_batch_of_eight_matches_in_step_commits(small_model) -> None:
    ahead = make_engine(small_model)
    count = AheadCount(ahead)
    step = make_engine(small_model, launch_ahead=False)
    try:
        free = _run_all(step, _requests())
        reqs = _requests(stop_id=free[2][0][4])  # row 2 stops on its 5th token (or earlier)
        t0 = time.perf_counter()
        got = _run_all(ahead, reqs)
        wall = time.perf_counter() - t0
        want = _run_all(step, reqs)
        assert got == want
        # rounds in flight together count their overlap once: decode time never exceeds wall time
        assert 0 < ahead.counters.total.decode_seconds < wall
        assert want[2][1] == "stop" and len(want[2][0]) <= 5
        assert count.fed > 10  # most rounds were launched ahead
        # a lane that finished with a round launched after it keeps its last token computed too
        lanes = [ln for ln in ahead.cache.lanes if ln.resident]
        assert all(len(ln.tokens) - ln.cached in (0, 1) for ln in lanes)
        assert any(ln.cached == len(ln.tokens) for ln in lanes)
    finally:
        ahead.shutdown(5)
        step.shutdown(5)


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse", "no-reuse"])
def test_stop_token_inside_launched_rounds_then_next_turn(small_model, reuse: bool) -> None:
    """A row that stops on a token while the next round is in flight; the next turn resumes on the
    retained lane and decodes what a reuse-off, in-step engine decodes."""
    ahead = make_engine(small_model, no_prefix_reuse=not reuse)
    cold = make_engine(small_model, no_prefix_reuse=True, launch_ahead=False)
    try:
        p = _prompt(24, 9)
        free = _run_all(cold, [GenerationRequest("a", p, SamplingParams(max_tokens=12, temperature=0.0))])[0]
        params = SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=(free[0][6],))
        got = _run_all(ahead, [GenerationRequest("a", p, params)])[0]
        assert got == _run_all(cold, [GenerationRequest("a", p, params)])[0] and got[1] == "stop"
        nxt = (*p, *got[0], *_prompt(9, 7))
        second = _run_all(ahead, [GenerationRequest("b", nxt, params)])
        assert second == _run_all(cold, [GenerationRequest("b", nxt, params)])
        if reuse:
            lane = next(ln for ln in ahead.cache.lanes if ln.resident)
            assert lane.cached == len(lane.tokens)
    finally:
        ahead.shutdown(5)
        cold.shutdown(5)


def test_arrivals_and_cancels_while_rounds_are_in_flight(small_model) -> None:
    """Requests submitted and cancelled while others decode ahead: every completed request gets
    the tokens it gets alone, and the engine keeps serving."""
    eng = make_engine(small_model)
    solo = make_engine(small_model, launch_ahead=False, max_concurrency=1, kv_capacity=256)
    try:
        params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
        first = eng.submit(eng.reserve(), GenerationRequest("a", _prompt(30, 1), params))
        got, later, doomed = [], None, None
        for i, step_out in enumerate(first):
            got.extend(step_out.token_ids)
            if i == 3:
                later = eng.submit(eng.reserve(), GenerationRequest("b", _prompt(25, 2), params))
                doomed = eng.submit(eng.reserve(), GenerationRequest("c", _prompt(22, 3), params))
            if i == 6 and doomed is not None:
                doomed.cancel()
            if step_out.finish_reason is not None:
                break
        assert later is not None and doomed is not None
        assert doomed.result(60)[1].finish_reason == "cancelled"
        assert got == _run_all(solo, [GenerationRequest("a", _prompt(30, 1), params)])[0][0]
        assert later.result(60)[0] == _run_all(solo, [GenerationRequest("b", _prompt(25, 2), params)])[0][0]
        assert _run_all(eng, [GenerationRequest("d", _prompt(10, 4), params)])[0][1] == "length"
    finally:
        eng.shutdown(5)
        solo.shutdown(5)


def test_penalized_rows_launch_ahead_on_device_counts(small_model) -> None:
    """Penalties count the generated tokens on the device: penalized batches (greedy, and the
    thinking preset's seeded sampling with a presence penalty) are launched ahead and give the
    tokens of committing every round first; a second wave on the same lanes starts from its own
    counts (each lane's count row is rewritten for its new request)."""
    eng = make_engine(small_model)
    count = AheadCount(eng)
    step = make_engine(small_model, launch_ahead=False)
    knobs: list[dict[str, Any]] = [
        {"temperature": 0.0, "frequency_penalty": 1.5},
        {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "presence_penalty": 1.5, "seed": 7},
        {"temperature": 0.0},
        {"temperature": 0.8, "frequency_penalty": 0.4, "presence_penalty": 0.3, "seed": 11},
    ]
    try:
        for wave in range(2):
            reqs = [
                GenerationRequest(
                    f"p{wave}{i}",
                    _prompt(18 + 4 * i, 5 + wave),
                    SamplingParams(max_tokens=10 + 3 * i, ignore_eos=True, **k),
                )
                for i, k in enumerate(knobs)
            ]
            assert _run_all(eng, reqs) == _run_all(step, reqs)
        assert count.fed > 0
    finally:
        eng.shutdown(5)
        step.shutdown(5)


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_a_failed_step_fails_its_rows_not_the_engine(small_model, kind: str) -> None:
    """One loop handles every kind's failure: a resolve that raises on a decode round with the
    next round launched ahead of it (resolved right after) or on a prefill chunk ends that
    step's requests with "error"; the engine serves the next request as an in-step engine does."""
    eng = make_engine(small_model)
    step = make_engine(small_model, launch_ahead=False)
    inner = eng.runner.resolve
    resolved: list[Any] = []
    fault: list[int] = []

    def resolve(launched: Any) -> Any:
        resolved.append(launched)
        fed = launched.result is None and launched.plan.rows[0].token == -1  # a round launched ahead
        if not fault and (fed if kind == "decode" else launched.result is not None):
            fault.append(len(resolved))
            raise RuntimeError("device fault")
        return inner(launched)

    eng.runner.resolve = resolve  # type: ignore[method-assign]
    try:
        params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
        reqs = [GenerationRequest(f"f{i}", _prompt(12 + i, i), params) for i in range(3)]
        reasons = [reason for _, reason in _run_all(eng, reqs)]
        if kind == "prefill":  # the first request's chunk failed, the others ran
            assert reasons == ["error", "length", "length"]
        else:  # the failed round's rows; the round launched ahead of it was resolved next
            assert "error" in reasons and set(reasons) <= {"error", "length"}
            assert resolved[fault[0]].plan.rows[0].token == -1  # the next round, fed on the device
        ok = [GenerationRequest("ok", _prompt(15, 8), params)]
        assert _run_all(eng, ok) == _run_all(step, ok)
        assert eng.error is None
    finally:
        eng.shutdown(5)
        step.shutdown(5)
