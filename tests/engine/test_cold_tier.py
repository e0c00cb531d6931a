"""The cold tier on the CPU: host arenas (`CpuArenaStore`) stand in for the secondary devices.

Conversations that lose their lane are parked and come back through a restore, with outputs equal
to engines that never reuse (or that keep every conversation resident on its own lane)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ninfer.engine.api import GenerationRequest, RequestStats, SamplingParams
from ninfer.engine.cold_tier_store import CpuArenaStore
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from tests.spec.helpers import mtp_model

MIB = 1 << 20


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
        "plain": engine(model),  # no secondary device on the CPU: the tier is inactive
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
