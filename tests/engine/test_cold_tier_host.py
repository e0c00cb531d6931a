"""The host-RAM cold tier an engine on the CPU builds by itself (no store injected): restored turns
answer exactly as the same conversations never evicted, and a restore is chunked across engine
rounds, interleaved with the decoding of other rows."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.engine.cold_tier import ColdTier
from ninfer.engine.cold_tier_host import HostArena
from ninfer.engine.engine import Engine
from tests.engine.test_cold_tier import Drafts, engine, run, tokens
from tests.speculative.helpers import mtp_model, request


@pytest.fixture(scope="module")
def model():
    return mtp_model(0)


@pytest.mark.parametrize("spec", [None, "mtp"])
@pytest.mark.parametrize("kv_dtype", [None, "int8"])
def test_restored_turns_equal_never_evicted(model, kv_dtype: str | None, spec: str | None) -> None:
    """Two conversations take turns on one lane, so each turn finds the other parked in host RAM;
    a two-lane engine without a tier keeps both resident. Conversation 0 re-sends its whole ledger
    (append at the frontier), conversation 1 re-renders its last turn (restore its turn checkpoint).
    Outputs, and with MTP the drafts, equal the resident engine's at every turn."""
    kw: dict[str, Any] = {"kv_dtype": kv_dtype}
    if spec is not None:
        kw |= {"spec_method": spec, "draft_tokens": 3}
    tier = engine(model, **kw)
    resident = engine(model, max_concurrency=2, kv_capacity=512, cold_tier_host_mib=0, **kw)
    drafts = {"tier": Drafts(tier), "resident": Drafts(resident)} if spec is not None else {}
    try:
        assert isinstance(tier.cold_tier, ColdTier) and resident.cold_tier is None
        (arena,) = tier.cold_tier.store.arenas
        assert isinstance(arena, HostArena)
        ledger = tokens(40, 1)  # conversation 0: prompt + reply + the next user turn
        head, open_turn = tokens(50, 2), tokens(9, 3)  # conversation 1: closed history + open turn
        for rnd in range(3):
            for c in (0, 1):
                prompt, turn = (ledger, None) if c == 0 else ([*head, *open_turn], len(head))
                for d in drafts.values():
                    d.rounds.clear()
                out, st = run(tier, prompt, turn, max_tokens=8)
                want, st_res = run(resident, prompt, turn, max_tokens=8)
                assert out == want
                if drafts:
                    assert drafts["tier"].rounds == drafts["resident"].rounds
                assert bool(st.cold_tier["restored"]) == (rnd > 0), st
                assert (st.reuse_path, st.cached_tokens) == (st_res.reuse_path, st_res.cached_tokens)
                if rnd > 0:
                    assert st.reuse_path == ("append_frontier" if c == 0 else "restore_turn_checkpoint")
                if c == 0:
                    ledger = [*ledger, *out, *tokens(5, 20 + rnd)]
                else:  # the next request closes this turn re-rendered (505 never occurs in `open_turn`)
                    head = [*head, 505, *out[:4], *tokens(4, 9)]
        c = tier.cold_tier.counters
        assert (c.restores, c.restore_failures, c.park_failures) == (4, 0, 0)
        assert tier.cold_tier.stats()["arenas"][0]["device"] == "cpu"
    finally:
        tier.shutdown(5)
        resident.shutdown(5)


class Rounds:
    """Wraps the tier's `advance`: per engine round with a restore under way, the restore's
    progress and how many tokens the other request (`watch`) had committed."""

    def __init__(self, eng: Engine) -> None:
        assert eng.cold_tier is not None
        self.eng, self.watch = eng, None
        self.log: list[tuple[int, int, bool]] = []  # (bytes moved so far, watched tokens, busy)
        inner = eng.cold_tier.advance

        def advance(busy: bool):
            tier = eng.cold_tier
            assert tier is not None
            out = inner(busy)
            other = eng.scheduler.get(self.watch) if self.watch is not None else None
            for job in tier._jobs.values():
                self.log.append((job.moved, len(other.generated) if other is not None else -1, busy))
            return out

        eng.cold_tier.advance = advance


def test_chunked_restore_interleaves_with_decoding(model) -> None:
    """Two lanes, 2 KiB of restore per round (a KV page row is 4 KiB): conversation A's image comes
    back over many rounds while request B decodes on the other lane, B's tokens advancing between
    A's chunks; A answers as an engine that kept it resident."""
    cfg = model.config
    chunk, row = 2048, 64 * cfg.num_key_value_heads * cfg.head_dim * 4  # fp32 K or V of one page
    eng = engine(model, max_concurrency=2, kv_capacity=512, cold_tier_restore_chunk_bytes=chunk)
    resident = engine(model, max_concurrency=3, kv_capacity=768, cold_tier_host_mib=0)
    rounds = Rounds(eng)
    try:
        a, c, d = tokens(200, 1), tokens(60, 2), tokens(60, 3)
        ga = run(eng, a)[0]
        assert ga == run(resident, a)[0]
        run(eng, c)  # both lanes resident: A, C
        run(eng, d)  # takes A's lane (the least recently used): A parked
        assert len(eng.cold_tier.store) == 1
        b = eng.submit(eng.reserve(), request(tokens(30, 4), max_tokens=120))  # takes C's lane
        first = next(iter(b))  # B decodes
        assert first.token_ids
        rounds.watch = max(eng.scheduler.by_id)
        nxt = [*a, *ga, *tokens(8, 5)]
        out, st = run(eng, nxt)  # takes D's lane, A's image comes back chunk by chunk
        assert out == run(resident, nxt)[0]
        assert st.cold_tier["restored"] and st.reuse_path == "append_frontier"
        with b:
            b.result(60)
        moved = [m for m, _, _ in rounds.log]  # after each round with the restore under way
        steps = [later - earlier for earlier, later in zip([0, *moved], moved, strict=False)]
        assert len(moved) >= 10 and moved[-1] > 8 * row  # 4 pages of K and V, then the GDN slot
        assert all(0 < n <= chunk + row for n in steps)  # a chunk a round (a row over it at most)
        seen = [n for _, n, busy in rounds.log if busy]
        assert len(seen) == len(rounds.log) and seen[-1] - seen[0] >= len(moved) - 2  # B decoded
        assert eng.cold_tier.counters.restore_rounds == len(moved)
    finally:
        eng.shutdown(5)
        resident.shutdown(5)
