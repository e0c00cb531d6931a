"""Engine behaviour: batch invariance, entitlement + FIFO admission, overload, timeouts, cancel."""

from __future__ import annotations

import threading
import time

import pytest

from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.stops import Detokenizer
from ninfer.engine.types import (
    ContextLengthExceeded,
    EngineError,
    EngineOverloaded,
    EngineStopped,
    GenerationRequest,
    QueueTimeout,
    SamplingParams,
)
from tests.engine.tiny import make_engine

PROMPT_LENS = (5, 130, 17, 64, 3, 90, 41, 200)


def _prompt(n: int, salt: int) -> tuple[int, ...]:
    return tuple((i * 37 + salt * 101 + 11) % 500 + 1 for i in range(n))


def _req(name: str, prompt, **params) -> GenerationRequest:
    return GenerationRequest(name, tuple(prompt), SamplingParams(**params))


def _run(engine, req: GenerationRequest, timeout: float = 120.0):
    h = engine.submit(engine.reserve(), req)
    tokens, last = h.result(timeout)
    h.close()
    return tokens, last, h.stats


@pytest.mark.parametrize("params", [{"temperature": 0.0}, {"temperature": 1.0, "top_p": 0.9}])
def test_batch_invariance(small_model, params) -> None:
    reqs = [
        _req(f"r{i}", _prompt(n, i), max_tokens=6, seed=1000 + i, ignore_eos=True, **params)
        for i, n in enumerate(PROMPT_LENS)
    ]
    alone_eng = make_engine(small_model, no_prefix_reuse=True, max_concurrency=1)
    alone = [_run(alone_eng, r)[0] for r in reqs]
    alone_eng.shutdown(5)
    eng = make_engine(small_model, max_concurrency=8, kv_capacity=8 * 256)
    handles = [eng.submit(eng.reserve(), r) for r in reqs]
    together = [h.result(120)[0] for h in handles]
    assert eng.counters.total.decode_row_rounds > eng.counters.total.decode_rounds  # real batching
    eng.shutdown(5)
    assert together == alone
    assert all(len(t) == 6 for t in alone)


def test_entitlement_and_fifo(small_model) -> None:
    # 5 pages of 64 tokens; A takes 4 (100 prompt + 100 output), B needs 2 and must wait for A;
    # C needs 1 page, which is free, but must not overtake B.
    eng = make_engine(small_model, max_concurrency=2, max_context=256, kv_capacity=320)
    # each submit() reads the engine's clock somewhere in [before, after] of the test's readings
    a0 = time.monotonic()
    ha = eng.submit(eng.reserve(), _req("A", _prompt(100, 1), max_tokens=100, ignore_eos=True))
    a1 = time.monotonic()
    while not eng.snapshot().running:
        time.sleep(0.005)
    b0 = time.monotonic()
    hb = eng.submit(eng.reserve(), _req("B", _prompt(10, 2), max_tokens=60, ignore_eos=True))
    b1 = c0 = time.monotonic()
    hc = eng.submit(eng.reserve(), _req("C", _prompt(10, 3), max_tokens=5, ignore_eos=True))
    c1 = time.monotonic()
    ta, la = ha.result(120)
    tb, _ = hb.result(120)
    tc, _ = hc.result(120)
    eng.shutdown(5)
    assert (len(ta), la.finish_reason, len(tb), len(tc)) == (100, "length", 60, 5)
    # the engine's own instants, each known within its submit window (a loaded machine widens
    # the windows; the comparisons allow exactly them, plus the engine's clock readings within
    # one step: A's finish read just after the admission that follows it)
    slack = 0.05
    a_end = (a0 + ha.stats.total_s, a1 + ha.stats.total_s)
    b_admit = (b0 + hb.stats.queue_s, b1 + hb.stats.queue_s)
    c_admit = (c0 + hc.stats.queue_s, c1 + hc.stats.queue_s)
    assert b_admit[1] >= a_end[0] - slack  # B's entitlement did not fit next to A's
    assert c_admit[1] >= b_admit[0] - slack  # C fit, but never overtakes the older B


def test_effective_output_entitlement_is_capped_by_max_context(small_model) -> None:
    eng = make_engine(small_model, max_concurrency=1, max_context=128)
    tokens, last, stats = _run(eng, _req("x", _prompt(120, 4), max_tokens=50, ignore_eos=True))
    assert (len(tokens), last.finish_reason, stats.completion_tokens) == (8, "length", 8)
    with pytest.raises(ContextLengthExceeded):
        eng.submit(eng.reserve(), _req("y", _prompt(128, 4), max_tokens=1))
    eng.shutdown(5)


def test_overload_and_queue_timeout(small_model) -> None:
    eng = make_engine(small_model, max_concurrency=1, max_pending=1, pending_timeout_ms=300)
    t1 = eng.reserve()
    t2 = eng.reserve()
    with pytest.raises(EngineOverloaded):
        eng.reserve()
    step = eng._step
    entered, release = threading.Event(), threading.Event()

    def held_step(plan) -> None:  # h1's steps wait for the test: h2 can only time out meanwhile
        entered.set()
        release.wait(60)
        step(plan)

    eng._step = held_step
    h1 = eng.submit(t1, _req("long", _prompt(20, 5), max_tokens=200, ignore_eos=True))
    assert entered.wait(30)
    h2 = eng.submit(t2, _req("late", _prompt(20, 6), max_tokens=2))
    with pytest.raises(QueueTimeout):
        h2.result(30)  # by its deadline, while h1 still held the only lane (no wall-clock bound)
    assert time.monotonic() >= t2.deadline
    release.set()
    h2.close()
    h1.cancel()
    assert h1.result(30)[1].finish_reason == "cancelled"
    h1.close()
    # an expired ticket is refused at submission
    t3 = eng.reserve()
    time.sleep(0.35)
    with pytest.raises(QueueTimeout):
        eng.submit(t3, _req("expired", _prompt(5, 7), max_tokens=2))
    t3.release()
    assert eng.tickets.live == 0
    eng.shutdown(5)


def test_queue_timeout_does_not_wait_for_a_long_step(small_model) -> None:
    """A step that does not end until the test says so: a waiting request's 503 still comes at
    its 0.3 s deadline (during that step: no bound on a wall-clock lateness, which a loaded
    machine stretches), the engine then drops it from the queue and the running request is
    unaffected."""
    eng = make_engine(small_model, max_concurrency=1, max_pending=1, pending_timeout_ms=300)
    step = eng._step
    entered, release = threading.Event(), threading.Event()  # a step began; it may end

    def slow_step(plan) -> None:
        entered.set()
        release.wait(60)
        step(plan)

    eng._step = slow_step
    h1 = eng.submit(eng.reserve(), _req("long", _prompt(20, 5), max_tokens=4, ignore_eos=True))
    assert entered.wait(30)  # the engine is inside h1's first step, and stays there
    t2 = eng.reserve()
    h2 = eng.submit(t2, _req("late", _prompt(20, 6), max_tokens=2))
    with pytest.raises(QueueTimeout):
        h2.result(30)
    assert time.monotonic() >= t2.deadline  # not before its deadline, and during that step
    release.set()
    h2.close()
    tokens, last = h1.result(30)
    assert (len(tokens), last.finish_reason) == (4, "length")
    h1.close()
    deadline = time.monotonic() + 60  # a bound for a hung engine, not a speed
    while eng.snapshot().waiting and time.monotonic() < deadline:
        time.sleep(0.05)
    assert eng.snapshot().waiting == 0 and eng.tickets.live == 0
    eng.shutdown(5)


@pytest.mark.parametrize("reuse", [True, False])
def test_cancel_mid_prefill_and_mid_decode_frees_everything(small_model, reuse) -> None:
    eng = make_engine(
        small_model,
        max_concurrency=2,
        max_context=512,
        kv_capacity=1024,
        prefill_chunk=16,
        no_prefix_reuse=not reuse,
    )
    free0 = eng.allocator.free_count
    h = eng.submit(eng.reserve(), _req("p", _prompt(500, 8), max_tokens=4))
    while eng.counters.total.prefill_tokens == 0:
        time.sleep(0.002)
    h.cancel()
    tokens, last = h.result(30)
    assert last.finish_reason == "cancelled" and tokens == []
    assert h.stats.computed_prefill_tokens < 500
    assert eng.allocator.free_count == free0
    h.close()
    h = eng.submit(eng.reserve(), _req("d", _prompt(30, 9), max_tokens=400, ignore_eos=True))
    first = h.get(30)
    assert first.token_ids and first.finish_reason is None
    h.cancel()
    tokens, last = h.result(30)
    assert last.finish_reason == "cancelled"
    assert eng.allocator.free_count == free0
    assert all(ln.active is None and ln.cached == 0 for ln in eng.cache.lanes)
    h.close()
    eng.shutdown(5)


def test_shutdown_drains_then_cancels(small_model) -> None:
    eng = make_engine(small_model, max_concurrency=1)
    h = eng.submit(eng.reserve(), _req("s", _prompt(10, 10), max_tokens=2000 % 240, ignore_eos=True))
    h2 = eng.submit(eng.reserve(), _req("w", _prompt(10, 11), max_tokens=3))
    eng.shutdown(drain_timeout_s=0.2)
    last = h.result(5)[1]
    assert last.finish_reason in ("length", "cancelled")
    try:
        assert h2.result(5)[1].finish_reason in ("length", "cancelled")
    except EngineStopped:
        pass
    with pytest.raises(EngineStopped):
        eng.reserve()


def test_submit_racing_the_drain_exit_is_refused(small_model) -> None:
    # The detokenizer factory runs inside submit() after its early checks: shutting the engine
    # down from there puts the drain loop's exit exactly between those checks and the enqueue.
    eng: Engine

    def factory() -> Detokenizer | None:
        eng.shutdown(5)  # returns once the engine thread has exited
        return None

    config = EngineConfig(max_concurrency=1, max_pending=1, max_context=256, prefill_chunk=64)
    eng = Engine(small_model, config, detokenizer_factory=factory).start()
    ticket = eng.reserve()
    with pytest.raises(EngineStopped):
        eng.submit(ticket, _req("late", _prompt(5, 12), max_tokens=2))
    ticket.release()
    assert eng._thread is None and not eng.scheduler.by_id and not eng._inbox


def test_engine_thread_failure_fails_every_request_and_refuses_new_ones(small_model) -> None:
    # A runner failure outside a step (here its graph capture) ends the engine thread: every
    # queued request ends with EngineError instead of waiting forever, and so does new work.
    config = EngineConfig(max_concurrency=1, max_pending=2, max_context=256, prefill_chunk=64)
    eng = Engine(small_model, config)

    def broken_capture() -> None:
        raise RuntimeError("capture failed")

    eng.runner.capture_graphs = broken_capture
    handles = [eng.submit(eng.reserve(), _req(f"q{i}", _prompt(8, 20 + i), max_tokens=4)) for i in range(2)]
    eng.start()
    for h in handles:
        with pytest.raises(EngineError, match="RuntimeError: capture failed"):
            h.result(30)
        h.close()
    assert eng.error == "RuntimeError: capture failed"
    with pytest.raises(EngineError):
        eng.reserve()
    assert eng.tickets.live == 0
    eng.shutdown(1)
