"""Prefix reuse with speculation: every reuse path gives the outputs of a never-reusing, never-
speculating engine, and the MTP drafter's state on a cache hit equals the one a miss rebuilds."""

from __future__ import annotations

import pytest

from tests.speculative.helpers import engine, mtp_model, prompt, request, run_batch


@pytest.fixture(scope="module")
def model():
    return mtp_model(0)


class Recorder:
    """Wraps a drafter's `propose` and keeps the drafts of every round of one request."""

    def __init__(self, eng) -> None:
        self.drafts: list[list[int]] = []
        inner = eng.spec.drafter.propose

        def propose(rows, k):
            out = inner(rows, k)
            self.drafts.extend(p.tokens for p in out)
            return out

        eng.spec.drafter.propose = propose


def _one(eng, req):
    ((tokens, st, _),) = run_batch(eng, [req])
    return tokens, st


@pytest.mark.parametrize("k", [2, 4])
def test_reuse_paths_equal_reuse_off_and_spec_off(model, k: int) -> None:
    spec = engine(model, spec_method="mtp", draft_tokens=k, max_concurrency=2, kv_capacity=512)
    ref = engine(model, no_prefix_reuse=True, max_concurrency=2, kv_capacity=512)
    try:
        p1 = prompt(100, 1)
        turns = []
        g1, st = _one(spec, request(p1, max_tokens=12, response=100, turn=70))
        turns.append((g1, st, "none"))
        p2 = (*p1, *g1, *prompt(20, 2))  # extends the ledger: append_frontier
        turns.append((*_one(spec, request(p2, max_tokens=12)), "append_frontier"))
        p3 = (*p1, (g1[0] + 1) % 500 + 1, *prompt(9, 3))  # a rewritten reply: response checkpoint
        turns.append(
            (*_one(spec, request(p3, max_tokens=12, response=len(p3))), "restore_response_checkpoint")
        )
        p4 = (*p1[:70], *prompt(30, 4))  # diverges inside the history: turn checkpoint
        turns.append((*_one(spec, request(p4, max_tokens=12)), "restore_turn_checkpoint"))
        for (got, st, path), p in zip(turns, (p1, p2, p3, p4), strict=True):
            want, _ = _one(ref, request(p, max_tokens=12))
            assert got == want and st.reuse_path == path
    finally:
        spec.shutdown(5)
        ref.shutdown(5)


@pytest.mark.parametrize("path", ["append_frontier", "restore_response_checkpoint"])
def test_mtp_state_after_a_cache_hit_equals_a_rebuild(model, path: str) -> None:
    """The drafts proposed while continuing a reused prefix equal those of an engine that prefilled
    the whole prompt itself: the MTP KV and pending hidden rows survived the reuse intact."""
    k = 3
    p1 = prompt(90, 5)
    hit = engine(model, spec_method="mtp", draft_tokens=k, max_concurrency=1, kv_capacity=256)
    miss = engine(model, spec_method="mtp", draft_tokens=k, max_concurrency=1, kv_capacity=256,
                  no_prefix_reuse=True)  # fmt: skip
    try:
        g1, _ = _one(hit, request(p1, max_tokens=10, response=90))
        if path == "append_frontier":
            p2 = (*p1, *g1, *prompt(12, 6))
        else:
            p2 = (*p1, (g1[0] + 3) % 500 + 1, *g1[1:], *prompt(12, 6))
        rec_hit, rec_miss = Recorder(hit), Recorder(miss)
        got, st = _one(hit, request(p2, max_tokens=16))
        want, _ = _one(miss, request(p2, max_tokens=16))
        assert st.reuse_path == path and st.cached_tokens > 0
        assert got == want
        assert len(rec_hit.drafts) == len(rec_miss.drafts) > 0
        assert rec_hit.drafts == rec_miss.drafts
    finally:
        hit.shutdown(5)
        miss.shutdown(5)
