"""GDN state-slot layout and lanes: each lane owns a live slot, checkpoint slots and KV pages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TURN = "turn"  # snapshot at the end of the closed history (before the open assistant turn)
RESPONSE = "response"  # snapshot at the prompt frontier (after the generation prologue)
CHECKPOINT_KINDS: tuple[str, ...] = (TURN, RESPONSE)


@dataclass(frozen=True)
class SlotLayout:
    """Static assignment of state-pool slots to lanes.

    Per lane, in order: one live slot (read and overwritten by every forward), one retained
    checkpoint slot per kind, then `draft_slots` slots reserved for speculative decoding (one
    per draft position, so verification can write the state after each draft token and the
    next step starts from the accepted one without a copy-back).
    """

    lanes: int
    checkpoint_kinds: tuple[str, ...] = CHECKPOINT_KINDS
    draft_slots: int = 0

    @property
    def per_lane(self) -> int:
        return 1 + len(self.checkpoint_kinds) + self.draft_slots

    @property
    def num_slots(self) -> int:
        return self.lanes * self.per_lane

    def live(self, lane: int) -> int:
        return lane * self.per_lane

    def checkpoint(self, lane: int, kind: str) -> int:
        return lane * self.per_lane + 1 + self.checkpoint_kinds.index(kind)

    def drafts(self, lane: int) -> tuple[int, ...]:
        base = lane * self.per_lane + 1 + len(self.checkpoint_kinds)
        return tuple(range(base, base + self.draft_slots))


@dataclass
class Lane:
    """One sequence's residency: live GDN slot, retained checkpoints, KV pages, token ledger.

    Invariant: the live slot and KV pages hold exactly the effect of `tokens[:cached]`;
    `tokens[cached:]` (at most the last sampled token) is committed but not yet fed. Each
    checkpoint `kind -> position` holds the live state as it was after `tokens[:position]`,
    with `position <= cached`.
    """

    index: int
    live_slot: int
    checkpoint_slots: dict[str, int]
    pages: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    cached: int = 0  # tokens whose effect is in the live slot and KV pages
    checkpoints: dict[str, int] = field(default_factory=dict)
    active: int | None = None  # id of the sequence running on this lane, None when idle
    last_used: int = 0  # LRU tick of the last time the lane was active
    # consumer-span keys (`ninfer.engine.multimodal.SpanKey`) of the media inside `tokens`
    media: tuple[Any, ...] = ()

    @property
    def resident(self) -> bool:
        """Idle but still holding reusable content."""
        return self.active is None and self.cached > 0

    def clear(self) -> list[int]:
        """Drop all content; returns the pages the caller must free."""
        pages, self.pages = self.pages, []
        self.tokens = []
        self.cached = 0
        self.checkpoints = {}
        self.media = ()
        return pages


def make_lanes(layout: SlotLayout) -> list[Lane]:
    return [
        Lane(
            index=i,
            live_slot=layout.live(i),
            checkpoint_slots={k: layout.checkpoint(i, k) for k in layout.checkpoint_kinds},
        )
        for i in range(layout.lanes)
    ]
