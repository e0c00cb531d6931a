"""The cold tier's policy: park a retained lane's state image, match prompts against parked images,
restore an image into fresh pages and a lane's slots.

A lane image holds everything a resident lane needs to continue exactly as if it had never left:
its KV pages (K, V and int8 scales; the MTP drafter's one-layer pool on the same page ids when
speculation is on), the GDN conv / ssm state of its live slot and of each retained checkpoint slot,
the MTP drafter's pending rows of those slots (tokens, hidden rows, rotary positions), and on the
host the token ledger, computed frontier, checkpoint positions and media span keys. A parked image
matches a prompt by the same rule as a resident lane (`match_lane`), so a restored lane resumes
through the ordinary reuse paths. Everything here is best effort: failures are counted and the
caller falls back to dropping (park) or to normal admission (restore).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ninfer.engine.cold_tier_store import (
    MIB,
    ColdTierStore,
    CudaArenaStore,
    PieceSpec,
    RestoreError,
    cuda_arenas,
)
from ninfer.engine.config import EngineConfig
from ninfer.engine.multimodal import SpanKey
from ninfer.engine.reuse import ReuseMatch, match_lane
from ninfer.engine.slots import Lane
from ninfer.engine.speculative.mtp import Pending
from ninfer.model.cache import KVPool, StatePool

log = logging.getLogger("ninfer.engine.cold_tier")
GIB = 1 << 30
LIVE = "live"


@dataclass(frozen=True)
class ImageMeta:
    """The host half of a parked lane image."""

    probe: Lane  # ledger, frontier, checkpoints, media: what `match_lane` reads
    pages: int  # KV pages in the image
    slots: tuple[str, ...]  # LIVE, then the checkpoint kinds, in piece order
    pending: tuple[
        tuple[int, tuple[int, ...], bool, bool], ...
    ]  # per slot: start, tokens, has hidden, has rope


@dataclass
class ColdTierCounters:
    parks: int = 0
    restores: int = 0
    park_failures: int = 0
    restore_failures: int = 0


@dataclass
class LanePools:
    """The device state a lane image covers."""

    kv: Sequence[KVPool]  # the trunk's pool, then the drafter's (same page ids)
    states: StatePool
    drafter: Any = None  # an object with `pending: list[Pending]` per slot (the MTP drafter), or None


def _kv_tensors(pool: KVPool) -> list[torch.Tensor]:
    return [*pool.k, *pool.v, *pool.k_scale, *pool.v_scale]  # each [num_pages, ...]


def _state_tensors(states: StatePool) -> list[torch.Tensor]:
    return [*states.conv, *states.ssm]  # each [num_slots, ...]


class ColdTier:
    """Parks and restores lane images through a `ColdTierStore` (engine thread only)."""

    def __init__(self, store: ColdTierStore, pools: LanePools, device: torch.device) -> None:
        self.store = store
        self.pools = pools
        self.device = device
        self.counters = ColdTierCounters()
        self._restored: set[int] = set()  # seq ids admitted onto a restored lane

    # ----- park -----
    def _slot_ids(self, lane: Lane) -> tuple[tuple[str, ...], list[int]]:
        kinds = tuple(k for k in lane.checkpoint_slots if k in lane.checkpoints)
        return (LIVE, *kinds), [lane.live_slot, *(lane.checkpoint_slots[k] for k in kinds)]

    def park(self, lane: Lane) -> bool:
        """Serialize a resident lane into the tier; False (counted) when it could not be stored."""
        try:
            names, slots = self._slot_ids(lane)
            pages = torch.tensor(lane.pages, dtype=torch.int64, device=self.device)
            sidx = torch.tensor(slots, dtype=torch.int64, device=self.device)
            gathers = [(t, pages) for pool in self.pools.kv for t in _kv_tensors(pool)]
            gathers += [(t, sidx) for t in _state_tensors(self.pools.states)]
            specs = [PieceSpec((len(idx), *t.shape[1:]), t.dtype) for t, idx in gathers]
            rows: list[torch.Tensor] = []  # the drafter's pending rows (small, kept as they are)
            pending = []
            if self.pools.drafter is not None:
                for s in slots:
                    p: Pending = self.pools.drafter.pending[s]
                    pending.append((p.start, p.tokens, p.hidden is not None, p.rope is not None))
                    rows += [t for t in (p.hidden, p.rope) if t is not None]
            specs += [PieceSpec(tuple(t.shape), t.dtype) for t in rows]
            probe = Lane(
                index=-1,
                live_slot=-1,
                checkpoint_slots={},
                tokens=list(lane.tokens),
                computed=lane.computed,
                checkpoints=dict(lane.checkpoints),
                media=tuple(lane.media),
            )
            meta = ImageMeta(probe, len(lane.pages), names, tuple(pending))
            with torch.inference_mode():  # one gathered piece on the device at a time
                pieces = itertools.chain((t.index_select(0, idx) for t, idx in gathers), rows)
                self.store.put(specs, pieces, meta)
        except Exception as exc:  # best effort: an image that cannot be stored is dropped
            self.counters.park_failures += 1
            log.warning("cold tier: park of a %d-token lane failed: %s", lane.computed, exc)
            return False
        self.counters.parks += 1
        return True

    # ----- match and restore -----
    def match(
        self, prompt: Sequence[int], media: Sequence[SpanKey], better_than: int
    ) -> tuple[int, int] | None:
        """The parked entry reusing the most prompt tokens (more than `better_than`), most recent on
        ties: (key, pages its image needs)."""
        best: tuple[ReuseMatch, int, ImageMeta] | None = None
        for key, meta in self.store.entries():
            m = match_lane(meta.probe, prompt, media)
            if m is not None and m.cached > better_than and (best is None or m.cached > best[0].cached):
                best = (m, key, meta)
        return None if best is None else (best[1], best[2].pages)

    def restore(self, key: int, lane: Lane, pages: list[int], seq_id: int) -> bool:
        """Write entry `key` into `lane` (empty, idle) on freshly allocated `pages`. On False (counted)
        the lane's slots may hold partial data: the caller clears the lane and frees the pages."""
        try:
            meta, pieces = self.store.take(key, self.device)
            if not isinstance(meta, ImageMeta) or meta.pages != len(pages):
                raise RestoreError(f"image of {getattr(meta, 'pages', '?')} pages for {len(pages)} pages")
            slots = [lane.live_slot if n == LIVE else lane.checkpoint_slots[n] for n in meta.slots]
            pidx = torch.tensor(pages, dtype=torch.int64, device=self.device)
            sidx = torch.tensor(slots, dtype=torch.int64, device=self.device)
            it = iter(pieces)
            with torch.inference_mode():
                for pool in self.pools.kv:
                    for t in _kv_tensors(pool):
                        t.index_copy_(0, pidx, next(it))
                for t in _state_tensors(self.pools.states):
                    t.index_copy_(0, sidx, next(it))
                if self.pools.drafter is not None:
                    if len(meta.pending) != len(slots):
                        raise RestoreError("the image carries no drafter rows")
                    for s, (start, tokens, has_h, has_r) in zip(slots, meta.pending, strict=True):
                        hidden = next(it) if has_h else None
                        rope = next(it) if has_r else None
                        self.pools.drafter.pending[s] = Pending(start, tokens, hidden, rope)
            if next(it, None) is not None:
                raise RestoreError("the image has more pieces than the pools")
        except Exception as exc:  # best effort: the request is admitted normally
            self.counters.restore_failures += 1
            log.warning("cold tier: restore failed, admitting normally: %s", exc)
            return False
        probe = meta.probe
        lane.pages = list(pages)
        lane.tokens = list(probe.tokens)
        lane.computed = probe.computed
        lane.checkpoints = dict(probe.checkpoints)
        lane.media = tuple(probe.media)
        self.counters.restores += 1
        self._restored.add(seq_id)
        return True

    # ----- reporting -----
    def take_restored(self, seq_id: int) -> bool:
        """Whether this request was admitted onto a restored lane (forgotten once asked)."""
        if seq_id in self._restored:
            self._restored.discard(seq_id)
            return True
        return False

    def stats(self) -> dict[str, Any]:
        """Cumulative counters and arena occupancy."""
        s, c = self.store, self.counters
        return {
            "parks": c.parks,
            "restores": c.restores,
            "evictions": s.evictions,
            "park_failures": c.park_failures,
            "restore_failures": c.restore_failures,
            "entries": len(s),
            "capacity_bytes": s.capacity_bytes,
            "used_bytes": s.used_bytes,
            "arenas": [a.describe() for a in s.arenas],
        }


def build_cold_tier(
    config: EngineConfig,
    pools: LanePools,
    device: torch.device,
    store: ColdTierStore | None = None,
) -> ColdTier | None:
    """The engine's tier: an injected store, else CUDA arenas on the secondary devices, else None
    (said once). Prefix reuse off or the tier disabled: None."""
    if not config.cold_tier or config.no_prefix_reuse:
        return None
    if store is None:
        if device.type != "cuda":
            log.info("cold tier inactive: the engine runs on %s, not a CUDA device", device)
            return None
        arenas, why = cuda_arenas(device, config.cold_tier_device, config.cold_tier_capacity_mib)
        if not arenas:
            log.info("cold tier inactive: %s", why)
            return None
        store = CudaArenaStore(arenas, config.cold_tier_staging_mib * MIB)
    log.info(
        "cold tier: %d arena(s) [%s], capacity %.2f GiB, staging %.0f MiB",
        len(store.arenas),
        ", ".join(str(a.device) for a in store.arenas),
        store.capacity_bytes / GIB,
        store.staging_bytes / MIB,
    )
    return ColdTier(store, pools, device)


def lane_pools(kv: KVPool, states: StatePool, spec: Any) -> LanePools:
    """The pools a lane image covers: the trunk's, plus the drafter's KV on the same page ids (MTP
    also carries its pending rows; a DFlash context entry depends only on its own token)."""
    drafter = getattr(spec, "drafter", None) if spec is not None else None
    extra, pending = drafter.lane_state() if drafter is not None else ([], None)
    return LanePools([kv, *extra], states, pending)
