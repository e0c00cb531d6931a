"""The cold tier's policy: park a retained lane's state image, match prompts against parked images,
restore an image into fresh pages and a lane's slots, a chunk per engine round.

A lane image holds everything a resident lane needs to continue exactly as if it had never left:
its KV pages (K, V and int8 scales; the MTP drafter's one-layer pool on the same page ids when
speculation is on), the GDN conv / ssm state of its live slot and of each retained checkpoint slot,
the MTP drafter's pending rows of those slots (tokens, hidden rows, rotary positions), and on the
host the token ledger, cached frontier, checkpoint positions and media span keys. A parked image
matches a prompt by the same rule as a resident lane (`match_lane`), so a restored lane resumes
through the ordinary reuse paths.

Images live in the arenas of a `ColdTierStore`: secondary GPUs (`cold_tier_devices`) and / or
pinned host RAM (`cold_tier_host`). Transfers run on their own CUDA stream (`cold_tier_stream`). A
restore is begun at admission (the lane takes the image's ledger at once, the request waits in
the scheduler's restore phase) and moved on by `advance` once per engine round, a decode step's
worth of bytes while other rows decode (`cold_tier_restore`). Everything here is best effort:
failures are counted and the caller falls back to dropping (park) or to prefilling the whole
prompt (restore).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ninfer.engine.cold_tier_devices import cuda_arenas, device_arenas
from ninfer.engine.cold_tier_host import host_arena
from ninfer.engine.cold_tier_restore import Pacer, RestoreJob, Target
from ninfer.engine.cold_tier_store import MIB, Arena, ColdTierStore, PieceSpec, RestoreError
from ninfer.engine.cold_tier_stream import TransferStream
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
    restore_rounds: int = 0  # engine rounds that moved restore bytes


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


def _scatter(dst: torch.Tensor, index: torch.Tensor) -> Any:
    """Rows [r0, r1) of a piece -> dst's rows index[r0:r1]."""
    return lambda r0, r1, rows: dst.index_copy_(0, index[r0:r1], rows)


class ColdTier:
    """Parks and restores lane images through a `ColdTierStore` (engine thread only)."""

    def __init__(
        self,
        store: ColdTierStore,
        pools: LanePools,
        device: torch.device,
        pacer: Pacer | None = None,
        chunk_bytes: int = 64 * MIB,
    ) -> None:
        self.store = store
        self.pools = pools
        self.device = device
        # `chunk_bytes` bounds a park's device temporaries in flight and a restore round's bytes
        self.stream = TransferStream(device, chunk_bytes)
        self.pacer = pacer or Pacer(most=chunk_bytes)
        self.counters = ColdTierCounters()
        self._restored: set[int] = set()  # seq ids admitted onto a restored lane
        self._jobs: dict[int, RestoreJob] = {}  # restores under way, by seq id
        self._lanes: dict[int, tuple[list[int], ImageMeta]] = {}  # the restores' slots, by seq id
        self._round_end: float | None = None  # when the last round with other work ended

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
                cached=lane.cached,
                checkpoints=dict(lane.checkpoints),
                media=tuple(lane.media),
            )
            meta = ImageMeta(probe, len(lane.pages), names, tuple(pending))
            with torch.inference_mode():  # one gathered piece on the device at a time
                pieces = itertools.chain((t.index_select(0, idx) for t, idx in gathers), rows)
                self.store.put(specs, pieces, meta, self.stream)
        except Exception as exc:  # best effort: an image that cannot be stored is dropped
            self.counters.park_failures += 1
            log.warning("cold tier: park of a %d-token lane failed: %s", lane.cached, exc)
            return False
        self.counters.parks += 1
        return True

    # ----- match and restore -----
    def match(
        self, prompt: Sequence[int], media: Sequence[SpanKey], better_than: int
    ) -> tuple[int, int] | None:
        """The parked entry reusing the most prompt tokens (more than `better_than`), most recent on
        ties: (key, pages its image needs). Images being restored are not parked any more."""
        busy = {job.key for job in self._jobs.values()}
        best: tuple[ReuseMatch, int, ImageMeta] | None = None
        for key, meta in self.store.entries():
            if key in busy:
                continue
            m = match_lane(meta.probe, prompt, media)
            if m is not None and m.cached > better_than and (best is None or m.cached > best[0].cached):
                best = (m, key, meta)
        return None if best is None else (best[1], best[2].pages)

    def _targets(self, meta: ImageMeta, slots: list[int], pages: list[int]) -> list[Target]:
        """Where the image's pieces go, in piece order, the drafter's pending rows left out."""
        with self.stream.scope():  # the indices live on the transfer stream, as their users
            pidx = torch.tensor(pages, dtype=torch.int64, device=self.device)
            sidx = torch.tensor(slots, dtype=torch.int64, device=self.device)
        out = [
            Target(PieceSpec((len(pages), *t.shape[1:]), t.dtype), _scatter(t, pidx))
            for pool in self.pools.kv
            for t in _kv_tensors(pool)
        ]
        out += [
            Target(PieceSpec((len(slots), *t.shape[1:]), t.dtype), _scatter(t, sidx))
            for t in _state_tensors(self.pools.states)
        ]
        if self.pools.drafter is not None:
            if len(meta.pending) != len(slots):
                raise RestoreError("the image carries no drafter rows")
        return out

    def begin_restore(self, key: int, lane: Lane, pages: list[int], seq_id: int) -> bool:
        """Start writing entry `key` into `lane` (empty, idle) on freshly allocated `pages`: the lane
        takes the image's ledger now, its device state arrives through `advance`. On False (counted)
        nothing was written: the caller clears the lane and frees the pages."""
        try:
            entry = self.store.open(key)
            meta = entry.meta
            if not isinstance(meta, ImageMeta) or meta.pages != len(pages):
                raise RestoreError(f"image of {getattr(meta, 'pages', '?')} pages for {len(pages)} pages")
            slots = [lane.live_slot if n == LIVE else lane.checkpoint_slots[n] for n in meta.slots]
            targets = self._targets(meta, slots, pages)
            kept = entry.specs[len(targets) :]  # the drafter's pending rows, whole
            targets += [Target(spec, None) for spec in kept]
            job = RestoreJob(key, entry, targets, seq_id, self.device)
        except Exception as exc:  # best effort: the request is admitted normally
            self.store.close(key, keep=False)
            self.counters.restore_failures += 1
            log.warning("cold tier: restore failed, admitting normally: %s", exc)
            return False
        self.stream.follow()  # the pages' and slots' previous owners wrote them on the engine stream
        probe = meta.probe
        lane.pages = list(pages)
        lane.tokens = list(probe.tokens)
        lane.cached = probe.cached
        lane.checkpoints = dict(probe.checkpoints)
        lane.media = tuple(probe.media)
        self._jobs[seq_id] = job
        self._lanes[seq_id] = (slots, meta)
        return True

    @property
    def restoring(self) -> bool:
        return bool(self._jobs)

    def advance(self, busy: bool) -> list[tuple[int, bool]]:
        """Move the restores under way one round on: at most the pacer's budget of bytes, shared.
        `busy`: other requests run this round. -> (seq id, restored) of the restores that ended;
        a False one failed (counted): its lane must be prefilled from scratch."""
        now = time.perf_counter()
        if busy and self._round_end is not None:
            self.pacer.observe_step(now - self._round_end)
        budget = self.pacer.budget(busy)
        ended: list[tuple[int, bool]] = []
        moved = 0
        for sid, job in list(self._jobs.items()):
            try:
                if job.end is not None:
                    if not job.end.done():
                        if busy:
                            continue  # the last chunk still runs beside the decode step
                        job.end.wait()
                    if job.start is not None:  # the chunk ran: its copy rate, once
                        self.pacer.observe_copy(job.last, job.end.seconds_since(job.start))
                        job.start = None
                if job.enqueued:
                    self._finish(sid, job)
                    ended.append((sid, True))
                    continue
                if moved < budget:
                    with torch.inference_mode():
                        moved += job.step(self.store, self.stream, budget - moved)
            except Exception as exc:
                self._fail(sid, job, exc)
                ended.append((sid, False))
        if moved:
            self.counters.restore_rounds += 1
        self._round_end = time.perf_counter() if busy and self._jobs else None
        return ended

    def _finish(self, sid: int, job: RestoreJob) -> None:
        self.stream.join()
        slots, meta = self._lanes.pop(sid)
        del self._jobs[sid]
        if self.pools.drafter is not None:
            it = iter(job.kept)
            for s, (start, tokens, has_h, has_r) in zip(slots, meta.pending, strict=True):
                hidden = next(it) if has_h else None
                rope = next(it) if has_r else None
                self.pools.drafter.pending[s] = Pending(start, tokens, hidden, rope)
        self.store.close(job.key, keep=False)
        self.counters.restores += 1
        self._restored.add(sid)

    def _fail(self, sid: int, job: RestoreJob, exc: Exception) -> None:
        self.stream.join()  # the partial writes land before the lane is reset on the engine stream
        self._jobs.pop(sid, None)
        self._lanes.pop(sid, None)
        self.store.close(job.key, keep=False)
        self.counters.restore_failures += 1
        log.warning("cold tier: restore failed, prefilling instead: %s", exc)

    def abort(self, seq_id: int) -> None:
        """The request of a restore under way left (cancelled): the image stays parked, and the
        lane's pages are safe to reuse once the streams are joined."""
        job = self._jobs.pop(seq_id, None)
        if job is None:
            return
        self._lanes.pop(seq_id, None)
        self.stream.join()
        self.store.close(job.key, keep=True)

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


def _arenas(config: EngineConfig, device: torch.device) -> tuple[list[Arena], list[str]]:
    """The arenas the settings ask for: secondary GPUs, then host RAM; what was said about each."""
    if device.type == "cuda":
        places, why = cuda_arenas(device, config.cold_tier_device, config.cold_tier_capacity_mib)
    else:
        places, why = [], f"the engine runs on {device}, no secondary GPU"
    arenas = device_arenas(places, config.cold_tier_staging_mib * MIB)
    host, how = host_arena(config.cold_tier_host_mib, bool(arenas))
    notes = [] if arenas else [why]
    if host is not None:
        arenas.append(host)
    notes.append(how)
    return arenas, notes


def build_cold_tier(
    config: EngineConfig,
    pools: LanePools,
    device: torch.device,
    store: ColdTierStore | None = None,
) -> ColdTier | None:
    """The engine's tier: an injected store, else arenas on the secondary GPUs and / or in host RAM
    (`cold_tier.host_mib`), else None (said once, with why). Prefix reuse off or the tier disabled:
    None."""
    if not config.cold_tier or config.no_prefix_reuse:
        return None
    if store is None:
        arenas, notes = _arenas(config, device)
        if not arenas:
            log.info("cold tier inactive: %s", "; ".join(notes))
            return None
        store = ColdTierStore(arenas)
        for note in notes:
            if note.startswith("host arena"):
                log.info("cold tier: %s", note)
    log.info(
        "cold tier: %d arena(s) [%s], capacity %.2f GiB, staging %.0f MiB",
        len(store.arenas),
        ", ".join(str(a.device) for a in store.arenas),
        store.capacity_bytes / GIB,
        store.staging_bytes / MIB,
    )
    chunk = config.cold_tier_staging_mib * MIB
    pacer = Pacer(most=chunk, fixed=config.cold_tier_restore_chunk_bytes)
    return ColdTier(store, pools, device, pacer=pacer, chunk_bytes=chunk)


def lane_pools(kv: KVPool, states: StatePool, spec: Any) -> LanePools:
    """The pools a lane image covers: the trunk's, plus the drafter's KV on the same page ids (MTP
    also carries its pending rows; a DFlash context entry depends only on its own token)."""
    drafter = getattr(spec, "drafter", None) if spec is not None else None
    extra, pending = drafter.lane_state() if drafter is not None else ([], None)
    return LanePools([kv, *extra], states, pending)
