"""Matching a prompt against a lane's cached tokens and checkpoints (the leaf both the prefix
cache and the cold tier use), and what the prefix cache needs of a cold tier."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ninfer.engine.multimodal import SpanKey, media_prefix_limit
from ninfer.engine.slots import RESPONSE, TURN, Lane
from ninfer.engine.types import ReusePath

_RESTORE_PATH: dict[str, ReusePath] = {
    TURN: "restore_turn_checkpoint",
    RESPONSE: "restore_response_checkpoint",
}


@dataclass(frozen=True)
class ReuseMatch:
    lane: Lane
    cached: int  # prompt tokens reused
    path: ReusePath
    restore: str | None  # checkpoint kind restored, None for append_frontier


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(a[lo:mid]) == list(b[lo:mid]):
            lo = mid
        else:
            hi = mid
    return lo


def match_lane(lane: Lane, prompt: Sequence[int], media: Sequence[SpanKey] = ()) -> ReuseMatch | None:
    """The best resume point of `prompt` (with the span keys of its media) on one resident lane, or None."""
    if lane.cached == 0:
        return None
    n = _lcp(lane.tokens[: lane.cached], prompt[: lane.cached])
    if lane.media or media:  # a changed earlier image / video ends the reusable prefix at its span
        n = media_prefix_limit(lane.media, media, n)
    best: ReuseMatch | None = None
    if n == lane.cached and len(prompt) > n:
        best = ReuseMatch(lane, n, "append_frontier", None)
    for kind, pos in lane.checkpoints.items():
        if 0 < pos <= n and pos < len(prompt) and (best is None or pos > best.cached):
            best = ReuseMatch(lane, pos, _RESTORE_PATH[kind], kind)
    return best


class TierStore(Protocol):
    """The cold tier's entry store as the prefix cache uses it."""

    def __len__(self) -> int: ...

    def pin(self, key: int) -> None: ...

    def unpin(self, key: int) -> None: ...


class Tier(Protocol):
    """A cold tier (`ninfer.engine.cold_tier.ColdTier`): parks an evicted lane, finds a parked image
    for a prompt and begins its restore onto a lane (the device state arrives over later rounds)."""

    @property
    def store(self) -> TierStore: ...

    def park(self, lane: Lane) -> bool: ...

    def match(
        self, prompt: Sequence[int], media: Sequence[SpanKey], better_than: int
    ) -> tuple[int, int] | None: ...

    def begin_restore(self, key: int, lane: Lane, pages: list[int], seq_id: int) -> bool: ...
