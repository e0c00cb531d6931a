"""Prefix reuse over resident lanes and lane/page admission (CPU bookkeeping only).

A finished request's lane stays resident (KV pages, live GDN slot, checkpoints, token ledger)
until its pages or lane are needed. A new prompt resumes from the longest valid point:

* append_frontier: the prompt extends the lane's cached ledger; resume from the live slot;
* restore_response_checkpoint / restore_turn_checkpoint: the prompt diverges after a
  checkpoint; copy that snapshot into the live slot and keep the KV pages up to it;
* full_reset: residents exist but none matches; a lane is taken and its slot zeroed.

Recurrent state cannot be rewound, so matching KV tokens alone never authorize a partial hit:
only the live frontier and the retained snapshots do. At least one prompt token is always
recomputed (the last prompt token's logits are not stored). A lane's cached frontier
(`Lane.cached`) is its ledger minus the last sampled token, or the whole ledger when the engine
had launched the round after its last one (launch-ahead decode feeds that token too).

With a cold tier (`ninfer.engine.cold_tier`), a resident that loses its lane (an eviction, or an
in-place full reset for another prompt) is parked there instead of dropped, and a parked image
that reuses more of a new prompt than any resident is restored onto an idle lane, which the
request then takes, resuming through the paths above. The lane holds the image's ledger at once;
its device state arrives over the next engine rounds (`Admission.restoring`: the request waits
for it before its first prefill chunk).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ninfer.engine.multimodal import SpanKey
from ninfer.engine.pages import PageAllocator, pages_for
from ninfer.engine.plan import SlotOp
from ninfer.engine.reuse import ReuseMatch, Tier, match_lane
from ninfer.engine.slots import Lane
from ninfer.engine.types import ReusePath


@dataclass
class Admission:
    """A lane and pages granted to a request; `ops` prepare the live slot before prefill."""

    lane: Lane
    cached: int
    path: ReusePath
    ops: list[SlotOp] = field(default_factory=list)
    evicted: int = 0  # residents dropped to make room
    restoring: bool = False  # the lane's state is on its way from the cold tier


class PrefixCache:
    """Owns the lanes and the page allocator; decides where an admitted request runs."""

    def __init__(
        self, lanes: list[Lane], allocator: PageAllocator, enabled: bool, tier: Tier | None = None
    ) -> None:
        self.lanes = lanes
        self.allocator = allocator
        self.enabled = enabled
        self.tier = tier  # the cold tier, when one is active
        self._tick = 0

    # ----- queries -----
    def residents(self) -> list[Lane]:
        return [ln for ln in self.lanes if ln.resident]

    def idle_lanes(self) -> list[Lane]:
        return [ln for ln in self.lanes if ln.active is None]

    def best_match(self, prompt: Sequence[int], media: Sequence[SpanKey] = ()) -> ReuseMatch | None:
        if not self.enabled:
            return None
        best: ReuseMatch | None = None
        for lane in self.residents():
            m = match_lane(lane, prompt, media)
            if m is not None and (
                best is None
                or m.cached > best.cached
                or (m.cached == best.cached and lane.last_used > best.lane.last_used)
            ):
                best = m
        return best

    # ----- admission -----
    def admit(
        self,
        seq_id: int,
        prompt: Sequence[int],
        need_pages: int,
        media: Sequence[SpanKey] = (),
        reuse: bool = True,
    ) -> Admission | None:
        """Grant a lane plus `need_pages` pages in total, or None (nothing is changed); `reuse`
        False: the prompt is computed from its start whatever matches."""
        idle = self.idle_lanes()
        if not idle:
            return None
        any_resident = bool(self.residents())  # before a restore parks one: still a full reset
        restored = (
            self._from_tier(seq_id, prompt, need_pages, media) if reuse and self.tier is not None else None
        )
        # a restored image beats every resident: the request takes its lane
        match = (
            (match_lane(restored, prompt, media) if restored is not None else self.best_match(prompt, media))
            if reuse
            else None
        )
        if match is not None:
            lane = match.lane
        else:
            empty = [ln for ln in idle if not ln.resident]
            lane = empty[0] if empty else min(idle, key=lambda ln: ln.last_used)
        kept = min(len(lane.pages), need_pages) if match is not None else 0
        others = sorted((ln for ln in self.residents() if ln is not lane), key=lambda ln: ln.last_used)
        reclaimable = len(lane.pages) + sum(len(ln.pages) for ln in others)
        if self.allocator.free_count + reclaimable < need_pages:
            return None
        had_resident = self.enabled and (any_resident or lane.resident or bool(others))
        if match is None and lane.resident:  # the lane's content is reset in place: park it first
            self._park(lane)
        # The chosen lane's pages beyond what the request keeps go back first.
        self.allocator.free(lane.pages[kept:])
        lane.pages = lane.pages[:kept]
        evicted = 0
        for victim in others:  # least recently used first
            if self.allocator.free_count + kept >= need_pages:
                break
            self._evict(victim)
            evicted += 1
        ops: list[SlotOp] = []
        if match is None:
            lane.clear()
            ops.append(SlotOp(dst=lane.live_slot))
            path: ReusePath = "full_reset" if had_resident else "none"
            cached = 0
        else:
            cached = match.cached
            path = match.path
            if match.restore is not None:
                ops.append(SlotOp(dst=lane.live_slot, src=lane.checkpoint_slots[match.restore]))
            # Checkpoints past the resume point describe a different continuation.
            lane.checkpoints = {k: p for k, p in lane.checkpoints.items() if p <= cached}
            lane.tokens = lane.tokens[:cached]
            lane.cached = cached
        lane.pages.extend(self.allocator.alloc(need_pages - len(lane.pages)))
        lane.media = tuple(media)
        lane.active = seq_id
        self._tick += 1
        lane.last_used = self._tick
        restoring = restored is not None and lane is restored
        return Admission(lane=lane, cached=cached, path=path, ops=ops, evicted=evicted, restoring=restoring)

    # ----- cold tier -----
    def _park(self, lane: Lane) -> None:
        if self.tier is not None and self.enabled and lane.resident:
            self.tier.park(lane)

    def _evict(self, lane: Lane) -> None:
        """Take a resident's content away (parked first when a tier is active) and free its pages."""
        self._park(lane)
        self.allocator.free(lane.clear())

    def _from_tier(
        self, seq_id: int, prompt: Sequence[int], need_pages: int, media: Sequence[SpanKey]
    ) -> Lane | None:
        """Begin restoring the parked image that reuses the most of `prompt` onto an idle lane, when
        it beats every resident and the request is admissible now (a waiting request changes
        nothing); -> that lane, or None."""
        assert self.tier is not None
        if not self.enabled or not len(self.tier.store):
            return None
        idle = self.idle_lanes()
        reclaimable = self.allocator.free_count + sum(len(ln.pages) for ln in idle)
        if reclaimable < need_pages:
            return None
        resident = self.best_match(prompt, media)
        found = self.tier.match(prompt, media, resident.cached if resident is not None else 0)
        if found is None or found[1] > reclaimable:
            return None
        key, image_pages = found
        empty = [ln for ln in idle if not ln.resident]
        lane = empty[0] if empty else min(idle, key=lambda ln: ln.last_used)
        self.tier.store.pin(key)  # parking the residents below must not evict the image
        begun = False
        try:
            if lane.resident:
                self._evict(lane)
            for victim in sorted(self.residents(), key=lambda ln: ln.last_used):
                if self.allocator.free_count >= image_pages:
                    break
                self._evict(victim)
            pages = self.allocator.alloc(image_pages)
            begun = self.tier.begin_restore(key, lane, pages, seq_id)  # pinned until it ends
            if not begun:
                lane.clear()
                self.allocator.free(pages)
        finally:
            if not begun:
                self.tier.store.unpin(key)
        return lane if begun else None

    def release(self, lane: Lane, keep: bool) -> None:
        """The lane's request ended: keep it resident (trimmed to its ledger) or clear it."""
        lane.active = None
        self._tick += 1
        lane.last_used = self._tick
        if keep and self.enabled and lane.cached > 0:
            need = pages_for(lane.cached)
            extra = lane.pages[need:]
            lane.pages = lane.pages[:need]
            self.allocator.free(extra)
        else:
            self.allocator.free(lane.clear())
