"""The cold tier on the CPU, through injected stores: host buffers standing in for secondary-GPU
arenas (`CpuArenaStore`, the devices' staging code) and, where a test is parametrized by store,
the host arena with small blocks (every image spans several; `tests/engine/test_cold_tier_host.py`
runs the host arena the engine builds itself).

Conversations that lose their lane are parked and come back through a restore, with outputs equal
to engines that never reuse (or that keep every conversation resident on its own lane)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from ninfer.engine.cold_tier_devices import CpuArenaStore
from ninfer.engine.cold_tier_host import HostArena
from ninfer.engine.cold_tier_store import Arena, ColdTierStore, RestoreError
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.sizing import page_bytes, slot_bytes
from ninfer.engine.types import GenerationRequest, RequestStats, SamplingParams
from tests.speculative.helpers import mtp_model

MIB = 1 << 20


def _devices(capacity: int, chunk: int) -> list[Arena]:
    return list(CpuArenaStore([capacity], staging_bytes=chunk).arenas)


def _host(capacity: int, chunk: int) -> list[Arena]:
    return [HostArena(capacity, pinned=False, block_bytes=chunk)]


# one arena of `capacity` bytes, transfers in `chunk`-byte pieces (staging) or blocks (host)
STORES = {"devices": _devices, "host": _host}


@pytest.fixture(scope="module")
def model():
    return mtp_model(0)


def engine(model: Any, store: CpuArenaStore | None = None, **kw: Any) -> Engine:
    base = EngineConfig(max_concurrency=1, max_pending=16, max_context=256, prefill_chunk=64, kv_capacity=256)
    return Engine(model, replace(base, **kw), cold_store=store).start()


def tokens(n: int, salt: int) -> list[int]:
    return [(i * 53 + salt * 7 + 3) % 500 + 1 for i in range(n)]


def run(
    eng: Engine, prompt: list[int], turn: int | None = None, max_tokens: int = 6
) -> tuple[list[int], RequestStats]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    with eng.submit(eng.reserve(), GenerationRequest("r", tuple(prompt), params, turn_checkpoint=turn)) as h:
        out, _ = h.result(60)
        return out, h.stats


class Chats:
    """Conversations whose turns append to the full ledger (prompt + reply + a new user turn)."""

    def __init__(self, n: int, first: int = 40, step: int = 12) -> None:
        self.ledgers = [tokens(first, 10 + c) for c in range(n)]
        self.step = step
        self.turn = 0

    def prompt(self, c: int) -> list[int]:
        return self.ledgers[c]

    def reply(self, c: int, out: list[int]) -> None:
        self.ledgers[c] = [*self.ledgers[c], *out, *tokens(self.step, 50 + c + 7 * len(self.ledgers[c]))]


def alternate(engines: dict[str, Engine], n: int, rounds: int) -> dict[str, list[RequestStats]]:
    """Run n conversations round-robin on every engine; outputs must be identical across engines."""
    chats = Chats(n)
    stats: dict[str, list[RequestStats]] = {k: [] for k in engines}
    for _ in range(rounds):
        for c in range(n):
            outs = {}
            for name, eng in engines.items():
                outs[name], st = run(eng, chats.prompt(c))
                stats[name].append(st)
            first = next(iter(outs.values()))
            assert all(o == first for o in outs.values()), outs
            chats.reply(c, first)
    return stats


def test_two_conversations_on_one_lane_restore_every_later_turn(model) -> None:
    engines = {
        "tier": engine(model, CpuArenaStore([4 * MIB, 4 * MIB], staging_bytes=4096)),
        "plain": engine(model, cold_tier_host_mib=0),  # no secondary device, no host arena: no tier
        "off": engine(model, no_prefix_reuse=True),
    }
    try:
        assert engines["plain"].cold_tier is None
        stats = alternate(engines, 2, 3)
        later = stats["tier"][2:]
        assert all(s.reuse_path == "append_frontier" and s.cached_tokens > 0 for s in later)
        assert all(s.cold_tier["restored"] for s in later)
        last = stats["tier"][-1].cold_tier
        assert last["restores"] == 4 and last["parks"] == 5 and last["entries"] == 1
        assert last["park_failures"] == last["restore_failures"] == last["evictions"] == 0
        assert [s.reuse_path for s in stats["plain"]] == ["none"] + ["full_reset"] * 5
        assert all(s.cached_tokens == 0 and not s.cold_tier for s in stats["plain"])
    finally:
        for eng in engines.values():
            eng.shutdown(5)


class Drafts:
    """Keeps the drafts a speculative engine proposes (MTP state after a restore shows in them)."""

    def __init__(self, eng: Engine) -> None:
        self.rounds: list[list[int]] = []
        inner = eng.spec.drafter.propose

        def propose(rows, k):
            out = inner(rows, k)
            self.rounds.extend(p.tokens for p in out)
            return out

        eng.spec.drafter.propose = propose


@pytest.mark.parametrize("kv_dtype", [None, "int8"])
def test_turn_checkpoint_restore_with_spec(model, kv_dtype: str | None) -> None:
    """A re-rendered final turn diverges right after the turn checkpoint: the parked image's
    checkpoint slot is restored and only the tail re-prefilled. Drafts equal those of an engine that
    kept both conversations resident (the MTP pool pages and pending rows came back intact)."""
    kw: dict[str, Any] = {"spec_method": "mtp", "draft_tokens": 3, "kv_dtype": kv_dtype}
    tier = engine(model, CpuArenaStore([8 * MIB], staging_bytes=1000), **kw)
    resident = engine(model, max_concurrency=2, kv_capacity=512, **kw)
    off = engine(model, no_prefix_reuse=True, kv_dtype=kv_dtype)
    drafts = {"tier": Drafts(tier), "resident": Drafts(resident)}
    try:
        heads = [tokens(50, 1), tokens(50, 2)]  # closed histories (turn checkpoint at their end)
        opens = [tokens(9, 3), tokens(9, 4)]  # open assistant turns: the generation prompt
        for rnd in range(3):
            for c in (0, 1):
                prompt, turn = [*heads[c], *opens[c]], len(heads[c])
                for d in drafts.values():
                    d.rounds.clear()
                out, st = run(tier, prompt, turn, max_tokens=8)
                want, st_res = run(resident, prompt, turn, max_tokens=8)
                assert out == want and drafts["tier"].rounds == drafts["resident"].rounds
                if kv_dtype is None:  # int8 rows quantised in a decode step can differ from a prefill's
                    assert out == run(off, prompt, max_tokens=8)[0]
                if rnd == 0:
                    assert not st.cold_tier["restored"]
                else:
                    assert st.cold_tier["restored"], st
                    want_path = ("restore_turn_checkpoint", turn - 9)  # the previous turn's checkpoint
                    assert (st.reuse_path, st.cached_tokens) == want_path
                    assert (st_res.reuse_path, st_res.cached_tokens) == want_path
                # the next request closes this turn re-rendered (505 never occurs in `opens`)
                heads[c] = [*heads[c], 505, *out[:4], *tokens(4, 9 + c)]
        c = tier.cold_tier.counters
        assert (c.restores, c.restore_failures, c.park_failures) == (4, 0, 0)
    finally:
        for eng in (tier, resident, off):
            eng.shutdown(5)


def _one_page_image_bytes(model: Any) -> int:
    """A parked 1-page lane without checkpoints: one KV page plus the live GDN slot."""
    cfg = model.config
    return page_bytes(cfg, torch.float32) + slot_bytes(cfg, torch.float32)


def _paths(stats: list[RequestStats]) -> list[tuple[str, bool]]:
    return [(s.reuse_path, bool(s.cold_tier.get("restored"))) for s in stats]


@pytest.mark.parametrize("kind", list(STORES))
def test_capacity_evicts_least_recently_parked(model, kind: str) -> None:
    """Three conversations, one lane, arenas holding two images: the LRU order decides who returns.
    Ledgers stay within one page, so every image has the same size."""
    size = _one_page_image_bytes(model)
    store = ColdTierStore(STORES[kind](2 * size + size // 2, 512))
    engines = {"tier": engine(model, store), "off": engine(model, no_prefix_reuse=True)}
    try:
        chats = Chats(3, first=20, step=4)
        stats: list[RequestStats] = []
        for _ in range(3):
            for c in range(3):
                out, st = run(engines["tier"], chats.prompt(c), max_tokens=4)
                assert out == run(engines["off"], chats.prompt(c), max_tokens=4)[0]
                # restored: the whole previous ledger, its last reply token included (fed by the
                # launched-ahead round after it), all but the 4 new tokens
                assert st.cached_tokens == (len(chats.prompt(c)) - 4 if st.cold_tier["restored"] else 0)
                stats.append(st)
                chats.reply(c, out)
        fr, af = ("full_reset", False), ("append_frontier", True)
        # A B C | A: restore (parking C evicts B) | B: evicted | C: restore (parking B evicts A) |
        # A: evicted | B: restore (parking A evicts C) | C: evicted
        assert _paths(stats) == [("none", False), fr, fr, af, fr, af, fr, af, fr]
        last = stats[-1].cold_tier
        assert (last["parks"], last["restores"], last["evictions"]) == (8, 3, 3)
        assert last["entries"] == 2 and last["used_bytes"] == 2 * size
        assert last["capacity_bytes"] == 2 * size + size // 2
    finally:
        for eng in engines.values():
            eng.shutdown(5)


class FailingReads(ColdTierStore):
    """A store whose next restore breaks mid-transfer, after a few pieces reached the pools."""

    fail = False
    _reads = 0

    def read(self, entry, offset: int, dst: torch.Tensor) -> None:
        if self.fail:
            self._reads += 1
            if self._reads > 6:
                self.fail = False
                raise RestoreError("injected transfer failure")
        super().read(entry, offset, dst)


@pytest.mark.parametrize("kind", list(STORES))
def test_oversize_park_and_failed_restore_fall_back(model, kind: str) -> None:
    small = engine(model, ColdTierStore(STORES[kind](1000, 256)))  # smaller than any image
    flaky_store = FailingReads(STORES[kind](1 * MIB, 256))
    flaky = engine(model, flaky_store)
    off = engine(model, no_prefix_reuse=True)
    try:
        chats = Chats(2)
        got: dict[str, list[RequestStats]] = {"small": [], "flaky": []}
        for rnd in range(2):
            for c in range(2):
                flaky_store.fail = (rnd, c) == (1, 0)
                want = run(off, chats.prompt(c))[0]
                for name, eng in (("small", small), ("flaky", flaky)):
                    out, st = run(eng, chats.prompt(c))
                    assert out == want
                    got[name].append(st)
                chats.reply(c, want)
        fr = ("full_reset", False)
        assert _paths(got["small"]) == [("none", False), fr, fr, fr]
        last = got["small"][-1].cold_tier
        assert (last["park_failures"], last["parks"], last["entries"], last["used_bytes"]) == (3, 0, 0, 0)
        # A's restore breaks: counted, dropped, A re-prefills; B (parked meanwhile) still restores
        assert _paths(got["flaky"]) == [("none", False), fr, fr, ("append_frontier", True)]
        last = got["flaky"][-1].cold_tier
        assert (last["restore_failures"], last["restores"], last["parks"]) == (1, 1, 3)
    finally:
        for eng in (small, flaky, off):
            eng.shutdown(5)


def test_pool_pressure_parks_other_residents(model) -> None:
    """Two lanes, four pages: a request needing the whole pool takes one resident's lane and evicts
    the other; both are parked, and both come back restored on their next turns."""
    kw: dict[str, Any] = {"max_concurrency": 2, "kv_capacity": 256}
    tier = engine(model, CpuArenaStore([2 * MIB], staging_bytes=2048), **kw)
    off = engine(model, no_prefix_reuse=True, **kw)
    try:

        def both(prompt: list[int], max_tokens: int = 6) -> tuple[list[int], RequestStats]:
            out, st = run(tier, prompt, max_tokens=max_tokens)
            assert out == run(off, prompt, max_tokens=max_tokens)[0]
            return out, st

        a, b = tokens(100, 1), tokens(100, 2)
        ga, _ = both(a)
        gb, _ = both(b)  # two residents of two pages each: no page free
        _, st = both(tokens(200, 3), max_tokens=50)  # needs all four pages
        assert st.reuse_path == "full_reset" and st.cold_tier["parks"] == 2
        assert tier.cache.allocator.free_count == 0
        for p, g in ((a, ga), (b, gb)):
            _, st = both([*p, *g, *tokens(10, 4)])
            # 100 prompt + 6 generated tokens, the last one fed by the launched-ahead round
            assert st.cold_tier["restored"] and (st.reuse_path, st.cached_tokens) == ("append_frontier", 106)
        c = tier.cold_tier.counters
        assert (c.parks, c.restores, c.park_failures, c.restore_failures) == (3, 2, 0, 0)
    finally:
        tier.shutdown(5)
        off.shutdown(5)
