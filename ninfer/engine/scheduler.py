"""CPU-side scheduling: the table of live requests, FIFO admission by page entitlement, prefill
chunking, decode batches."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ninfer.engine.plan import DecodePlan, DecodeRow, PrefillBatch, PrefillPlan, SlotOp, StepPlan
from ninfer.engine.prefix_cache import PrefixCache
from ninfer.engine.request import DECODE, DONE, PREFILL, RESTORE, WAITING, Request
from ninfer.engine.slots import RESPONSE, TURN


@dataclass(frozen=True)
class Snapshot:
    running: int
    prefilling: int
    decode_ready: int
    waiting: int
    free_pages: int
    total_pages: int
    idle_lanes: int
    resident_lanes: int
    resident_pages: int  # pages held by idle lanes for prefix reuse (free + resident = total when idle)


# (tokens, start, pages held) of each chunk -> the bucket q of a captured prefill graph with one
# row per chunk that takes them all, or None (`Runner.prefill_bucket`)
PrefillFit = Callable[[list[tuple[int, int, int]]], int | None]


class Scheduler:
    """The live requests' table (`by_id`), its waiting queue and active set, and step planning.
    Used only by the engine thread: a request enters with `enqueue` and leaves with `finish`."""

    def __init__(self, cache: PrefixCache, max_concurrency: int, prefill_chunk: int) -> None:
        self.cache = cache
        self.max_concurrency = max_concurrency
        self.prefill_chunk = prefill_chunk
        self.by_id: dict[int, Request] = {}  # every live request: waiting, restoring, running
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []  # admission order
        self._prefer_prefill = True
        self.prefill_fit: PrefillFit | None = None  # set once the prefill graphs exist

    # ----- queue -----
    def enqueue(self, req: Request) -> None:
        self.by_id[req.id] = req
        self.waiting.append(req)

    def get(self, request_id: int) -> Request | None:
        """The live request with this id (None once it finished)."""
        return self.by_id.get(request_id)

    def expire(self, now: float) -> list[Request]:
        """Remove and return waiting requests whose admission deadline has passed."""
        late = [s for s in self.waiting if s.ticket.deadline <= now]
        for s in late:
            self.waiting.remove(s)
        return late

    def admit(self, now: float) -> list[Request]:
        """Admit waiting requests in FIFO order while the head fits; never skip the head."""
        admitted: list[Request] = []
        while self.waiting and len(self.active) < self.max_concurrency:
            req = self.waiting[0]
            if not req.handle.claim_admission():  # the caller timed it out: its cancel removes it
                break
            mm = req.submitted.multimodal
            media = mm.keys() if mm is not None else ()
            # scoring the prompt needs every position's logits: no prefix is reused
            reuse = req.submitted.params.prompt_logprobs is None
            adm = self.cache.admit(req.id, req.prompt, req.need_pages, media, reuse=reuse)
            if adm is None:
                req.handle.release_admission()
                break
            self.waiting.popleft()
            req.lane = adm.lane
            req.phase = RESTORE if adm.restoring else PREFILL
            req.pending_ops = list(adm.ops)
            req.stats.cached_tokens = adm.cached
            req.stats.reuse_path = adm.path
            req.t_admit = now
            adm.lane.tokens = list(req.prompt[: adm.cached])
            self._plan_captures(req)
            self.active.append(req)
            admitted.append(req)
        return admitted

    def _plan_captures(self, req: Request) -> None:
        if not self.cache.enabled or req.lane is None:
            return
        lane = req.lane
        wanted = ((TURN, req.submitted.turn_checkpoint), (RESPONSE, req.submitted.response_checkpoint))
        for kind, pos in wanted:
            if pos is None or pos <= 0 or pos > len(req.prompt):
                continue
            if pos < lane.cached:
                continue  # behind the reuse frontier with no snapshot there: defer
            if pos == lane.cached:  # the resume point itself: snapshot before prefill
                req.pending_ops.append(SlotOp(dst=lane.checkpoint_slots[kind], src=lane.live_slot))
                lane.checkpoints[kind] = pos
            else:
                req.captures.setdefault(pos, []).append(kind)

    def restore_ended(self, req: Request, restored: bool) -> None:
        """The cold tier finished writing the request's lane: prefill from the admitted resume
        point, or (a failed restore) from the start of the prompt on the same lane and pages."""
        if req.phase != RESTORE or req.lane is None:
            return
        if not restored:
            lane = req.lane
            lane.tokens, lane.cached, lane.checkpoints = [], 0, {}
            req.pending_ops = [SlotOp(dst=lane.live_slot)]
            req.captures = {}
            req.stats.cached_tokens = 0
            req.stats.reuse_path = "full_reset"
            self._plan_captures(req)
        req.phase = PREFILL

    # ----- planning -----
    def decode_ready(self) -> list[Request]:
        return [s for s in self.active if s.phase == DECODE]

    def prefilling(self) -> list[Request]:
        return [s for s in self.active if s.phase == PREFILL]

    def next_plan(self) -> StepPlan | None:
        """Alternate one prefill chunk and one decode round while both kinds of work exist."""
        pre = self.prefilling()
        dec = self.decode_ready()
        if pre and (self._prefer_prefill or not dec):
            self._prefer_prefill = False
            group, q = self._prefill_group(pre)
            if q is None:
                return self._prefill_plan(pre[0])
            return PrefillBatch([self._prefill_plan(s) for s in group], q)
        if dec:
            self._prefer_prefill = True
            return DecodePlan(rows=[self._decode_row(s) for s in dec])
        return None

    def _prefill_group(self, pre: list[Request]) -> tuple[list[Request], int | None]:
        """The first prefilling request and, in admission order, as many of the others whose next
        chunk a captured prefill graph takes as one graph takes together (text chunks, each padded
        to one bucket; graphs exist for some row counts); the bucket, or None for the first alone."""
        fit = self.prefill_fit
        if fit is None or len(pre) < 2 or not _graphable(pre[0]):
            return pre[:1], None
        shapes = [self._chunk_shape(pre[0])]
        if fit(shapes) is None:
            return pre[:1], None
        group = [pre[0]]
        for req in pre[1:]:
            shape = self._chunk_shape(req)
            if _graphable(req) and fit([shape]) is not None:
                group.append(req)
                shapes.append(shape)
        for n in range(len(group), 1, -1):
            q = fit(shapes[:n])
            if q is not None:
                return group[:n], q
        return pre[:1], None

    def _chunk_shape(self, req: Request) -> tuple[int, int, int]:
        """(tokens, start, pages held) of a prefilling request's next chunk."""
        assert req.lane is not None
        start, end = self._chunk_bounds(req)
        return end - start, start, len(req.lane.pages)

    def _chunk_bounds(self, req: Request) -> tuple[int, int]:
        """[start, end) of a prefilling request's next chunk: at most `prefill_chunk` tokens,
        ending at the next checkpoint to capture."""
        assert req.lane is not None
        start = req.lane.cached
        end = min(len(req.prompt), start + self.prefill_chunk)
        cuts = [p for p in req.captures if start < p < end]
        return start, min(cuts) if cuts else end

    def _prefill_plan(self, req: Request) -> PrefillPlan:
        assert req.lane is not None
        lane = req.lane
        start, end = self._chunk_bounds(req)
        ops_after = [
            SlotOp(dst=lane.checkpoint_slots[k], src=lane.live_slot) for k in req.captures.get(end, [])
        ]
        ops_before, req.pending_ops = req.pending_ops, []
        last = end == len(req.prompt)
        scoring = req.submitted.params.prompt_logprobs
        return PrefillPlan(
            seq_id=req.id,
            tokens=list(req.prompt[start:end]),
            cached=start,
            slot=lane.live_slot,
            pages=lane.pages,
            ops_before=ops_before,
            ops_after=ops_after,
            sampler=req.sampler if last and req.entitlement > 0 else None,
            multimodal=req.submitted.multimodal,
            prompt_logprobs=scoring,
            targets=list(req.prompt[start + 1 : end + 1]) if scoring is not None else [],
        )

    def _decode_row(self, req: Request) -> DecodeRow:
        assert req.lane is not None
        lane = req.lane
        return DecodeRow(
            seq_id=req.id,
            token=lane.tokens[lane.cached],
            cached=lane.cached,
            slot=lane.live_slot,
            pages=lane.pages,
            sampler=req.sampler,
            rope_delta=req.submitted.multimodal.rope_delta if req.submitted.multimodal is not None else 0,
        )

    # ----- applying results -----
    def prefill_done(self, req: Request, plan: PrefillPlan) -> None:
        """Record a finished chunk: the lane's computed frontier and captured checkpoints."""
        assert req.lane is not None
        lane = req.lane
        end = plan.cached + len(plan.tokens)
        lane.tokens.extend(plan.tokens)
        lane.cached = end
        for kind in req.captures.pop(end, []):
            lane.checkpoints[kind] = end
        if end == len(req.prompt):
            req.phase = DECODE

    def decode_fed(self, req: Request) -> None:
        """The pending token of a decode row went through the model."""
        assert req.lane is not None
        req.lane.cached += 1

    def commit(self, req: Request, token: int) -> None:
        """Append a sampled token to the request's output and its lane ledger."""
        assert req.lane is not None
        req.generated.append(token)
        req.lane.tokens.append(token)
        req.sampler.observe(token)

    def finish(self, req: Request, keep: bool) -> None:
        """Remove a request (finished, cancelled or failed) from the table and its queue or active
        set; `keep` retains its lane for prefix reuse."""
        self.by_id.pop(req.id, None)
        if req.phase == WAITING:
            if req in self.waiting:
                self.waiting.remove(req)
        elif req in self.active:
            self.active.remove(req)
            assert req.lane is not None
            self.cache.release(req.lane, keep=keep)
        req.phase = DONE

    def snapshot(self) -> Snapshot:
        alloc = self.cache.allocator
        return Snapshot(
            running=len(self.active),
            prefilling=len(self.prefilling()),
            decode_ready=len(self.decode_ready()),
            waiting=len(self.waiting),
            free_pages=alloc.free_count,
            total_pages=alloc.num_pages,
            idle_lanes=sum(1 for ln in self.cache.lanes if ln.active is None and not ln.resident),
            resident_lanes=len(self.cache.residents()),
            resident_pages=sum(len(ln.pages) for ln in self.cache.residents()),
        )


def _graphable(req: Request) -> bool:
    """Whether a request's chunks may run in a captured prefill graph: text, not scored (a
    scored chunk reads every position's logits, on the eager path)."""
    return req.submitted.multimodal is None and req.submitted.params.prompt_logprobs is None
