"""Each prefix-reuse path, asserted by name, with outputs equal to a reuse-off engine."""

from __future__ import annotations

import pytest

from ninfer.engine.types import GenerationRequest, SamplingParams
from tests.engine.tiny import make_engine


def _prompt(n: int, salt: int) -> list[int]:
    return [(i * 53 + salt * 7 + 3) % 500 + 1 for i in range(n)]


class Pair:
    """The same requests on a reuse-on and a reuse-off engine; outputs must be identical."""

    def __init__(self, model, **kw) -> None:
        self.on = make_engine(model, **kw)
        self.off = make_engine(model, no_prefix_reuse=True, **kw)

    def run(self, prompt, turn=None, response=None, max_tokens=5, **params):
        req = GenerationRequest(
            "r",
            tuple(prompt),
            SamplingParams(**{"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, **params}),
            turn_checkpoint=turn,
            response_checkpoint=response,
        )
        out = []
        for eng in (self.on, self.off):
            with eng.submit(eng.reserve(), req) as h:
                out.append((h.result(60)[0], h.stats))
        (tok_on, st_on), (tok_off, st_off) = out
        assert tok_on == tok_off
        assert st_off.cached_tokens == 0 and st_off.reuse_path == "none"
        assert st_on.computed_prefill_tokens == len(prompt) - st_on.cached_tokens
        return tok_on, st_on

    def close(self) -> None:
        self.on.shutdown(5)
        self.off.shutdown(5)


@pytest.fixture
def pair(small_model):
    p = Pair(small_model, max_concurrency=2, max_context=512, kv_capacity=1024, prefill_chunk=64)
    yield p
    p.close()


@pytest.mark.parametrize("ahead", [True, False], ids=["launch-ahead", "in-step"])
def test_append_frontier(small_model, ahead: bool) -> None:
    pair = Pair(
        small_model,
        max_concurrency=2,
        max_context=512,
        kv_capacity=1024,
        prefill_chunk=64,
        launch_ahead=ahead,
    )
    p1 = _prompt(100, 1)
    g1, st = pair.run(p1)
    assert st.reuse_path == "none"
    g2, st = pair.run(p1 + g1 + _prompt(20, 2))
    # the last sampled token went through the model only when a round was launched after it
    assert (st.reuse_path, st.cached_tokens) == ("append_frontier", 105 if ahead else 104)
    full = p1 + g1 + _prompt(20, 2) + g2
    if ahead:  # the ledger is all computed: a longer prompt resumes at its end
        _, st = pair.run([*full, 7])
        assert (st.reuse_path, st.cached_tokens) == ("append_frontier", 130)
    else:  # a prompt equal to the full ledger still needs one computed token for its logits
        _, st = pair.run(full)
        assert (st.reuse_path, st.cached_tokens) == ("append_frontier", 129)
    pair.close()


def test_restore_response_checkpoint(pair) -> None:
    p1 = _prompt(100, 3)
    g1, _ = pair.run(p1, response=100)
    rewritten = [(g1[0] + 1) % 500 + 1, *g1[1:]]  # a normalized reply: differs from the raw tokens
    _, st = pair.run(p1 + rewritten + _prompt(30, 4))
    assert (st.reuse_path, st.cached_tokens) == ("restore_response_checkpoint", 100)


def test_restore_turn_checkpoint_splits_the_prefill_there(pair) -> None:
    p1 = _prompt(150, 5)
    pair.run(p1, turn=90, response=150)
    _, st = pair.run(p1[:90] + _prompt(40, 6))
    assert (st.reuse_path, st.cached_tokens) == ("restore_turn_checkpoint", 90)
    # the lane now holds the second prompt; its turn snapshot (90) survived the restore
    _, st = pair.run(p1[:90] + _prompt(7, 9))
    assert (st.reuse_path, st.cached_tokens) == ("restore_turn_checkpoint", 90)


def test_full_reset(pair) -> None:
    pair.run(_prompt(80, 7), turn=40)
    pair.run(_prompt(80, 8), turn=40)  # second lane
    _, st = pair.run(_prompt(60, 9))
    assert (st.reuse_path, st.cached_tokens) == ("full_reset", 0)


def test_checkpoint_behind_frontier_is_deferred_and_old_one_kept(pair) -> None:
    p1 = _prompt(100, 10)
    g1, _ = pair.run(p1, turn=50)
    p2 = p1 + g1 + _prompt(10, 11)
    _, st = pair.run(p2, turn=70)  # 70 is behind the reuse frontier (104): no snapshot there
    assert st.reuse_path == "append_frontier"
    _, st = pair.run(p1[:80] + _prompt(10, 12))
    assert (st.reuse_path, st.cached_tokens) == ("restore_turn_checkpoint", 50)


def test_checkpoint_at_the_resume_point_is_captured(pair) -> None:
    p1 = _prompt(100, 13)
    pair.run(p1, turn=60)
    _, st = pair.run(p1[:60] + _prompt(30, 14), turn=60)
    assert (st.reuse_path, st.cached_tokens) == ("restore_turn_checkpoint", 60)
    _, st = pair.run(p1[:60] + _prompt(5, 15))
    assert (st.reuse_path, st.cached_tokens) == ("restore_turn_checkpoint", 60)


def test_lru_eviction_of_residents_under_page_pressure(small_model) -> None:
    # the residents' own LRU: no host cold tier to bring an evicted one back (tests/engine/test_cold_tier*)
    pair = Pair(
        small_model,
        max_concurrency=3,
        max_context=256,
        kv_capacity=512,
        prefill_chunk=64,
        cold_tier_host_mib=0,
    )
    a, b, c = _prompt(120, 16), _prompt(120, 17), _prompt(190, 18)
    ga, _ = pair.run(a)  # resident A: 2 pages
    gb, _ = pair.run(b)  # resident B: 2 pages
    gc, _ = pair.run(c, max_tokens=60)  # fits in the 4 free pages: resident C, 4 pages
    assert pair.on.scheduler.snapshot().resident_lanes == 3
    assert pair.on.allocator.free_count == 0
    # D needs 4 pages and a lane: it takes the least recently used lane (A, 2 pages) and evicts
    # the next least recently used resident (B); C, the newest, stays.
    _, st = pair.run(_prompt(200, 19), max_tokens=56)
    assert st.reuse_path == "full_reset"
    _, st = pair.run(c + gc + [1, 2, 3], max_tokens=2)
    assert (st.reuse_path, st.cached_tokens) == ("append_frontier", 250)  # the last reply token fed ahead
    _, st = pair.run(b + gb + [1, 2, 3], max_tokens=2)
    assert st.cached_tokens == 0
    _, st = pair.run(a + ga + [1, 2, 3], max_tokens=2)
    assert st.cached_tokens == 0
    pair.close()


def test_seeded_sampling_identical_with_reuse(pair) -> None:
    p1 = _prompt(90, 20)
    g1, _ = pair.run(p1, temperature=1.0, seed=5, top_k=50, response=90)
    _, st = pair.run(p1 + g1 + _prompt(9, 21), temperature=1.0, seed=6, top_p=0.9)
    assert st.reuse_path == "append_frontier"
