"""CPU-side scheduling: FIFO admission by page entitlement, prefill chunking, decode batches."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ninfer.engine.pages import pages_for
from ninfer.engine.plan import DecodePlan, DecodeRow, PrefillBatch, PrefillPlan, SlotOp, StepPlan
from ninfer.engine.prefix_cache import PrefixCache
from ninfer.engine.sampler import RowSampler
from ninfer.engine.slots import RESPONSE, TURN, Lane
from ninfer.engine.stops import StopChecker
from ninfer.engine.tickets import Ticket
from ninfer.engine.types import GenerationRequest, RequestStats, TokenLogprob

WAITING, PREFILL, DECODE, DONE = "waiting", "prefill", "decode", "done"
RESTORE = "restore"  # admitted onto a lane whose state the cold tier is still writing


@dataclass(eq=False)
class Seq:
    """One submitted request's runtime state (owned by the engine thread after submission)."""

    id: int
    request: GenerationRequest
    ticket: Ticket
    entitlement: int  # output tokens allowed: min(max_tokens, max_context - prompt)
    sampler: RowSampler
    stops: StopChecker
    stats: RequestStats
    t_submit: float
    phase: str = WAITING
    lane: Lane | None = None
    prefill_pos: int = 0  # prompt tokens in the cache
    generated: list[int] = field(default_factory=list)
    captures: dict[int, list[str]] = field(default_factory=dict)  # position -> checkpoint kinds
    pending_ops: list[SlotOp] = field(default_factory=list)  # slot ops before the first chunk
    # a scoring request's prompt logprobs so far (None for the first prompt token)
    prompt_lps: list[TokenLogprob | None] = field(default_factory=lambda: [None])
    t_admit: float = 0.0
    t_first: float = 0.0
    compiles_at_submit: int = 0  # jit_watch.count() when submitted (RequestStats.compilations)
    claim: Callable[[], bool] = lambda: True  # the handle's admission claim (`RequestHandle`)
    unclaim: Callable[[], None] = lambda: None  # admission did not happen after all

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.prompt_ids

    @property
    def need_pages(self) -> int:
        return pages_for(len(self.prompt) + self.entitlement)


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
    """Waiting queue, active set and step planning. Used only by the engine thread."""

    def __init__(self, cache: PrefixCache, max_concurrency: int, prefill_chunk: int) -> None:
        self.cache = cache
        self.max_concurrency = max_concurrency
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Seq] = deque()
        self.active: list[Seq] = []  # admission order
        self._prefer_prefill = True
        self.prefill_fit: PrefillFit | None = None  # set once the prefill graphs exist

    # ----- queue -----
    def enqueue(self, seq: Seq) -> None:
        self.waiting.append(seq)

    def expire(self, now: float) -> list[Seq]:
        """Remove and return waiting requests whose admission deadline has passed."""
        late = [s for s in self.waiting if s.ticket.deadline <= now]
        for s in late:
            self.waiting.remove(s)
        return late

    def admit(self, now: float) -> list[Seq]:
        """Admit waiting requests in FIFO order while the head fits; never skip the head."""
        admitted: list[Seq] = []
        while self.waiting and len(self.active) < self.max_concurrency:
            seq = self.waiting[0]
            if not seq.claim():  # the caller timed it out already; its cancel removes it
                break
            mm = seq.request.multimodal
            media = mm.keys() if mm is not None else ()
            # scoring the prompt needs every position's logits: no prefix is reused
            reuse = seq.request.params.prompt_logprobs is None
            adm = self.cache.admit(seq.id, seq.prompt, seq.need_pages, media, reuse=reuse)
            if adm is None:
                seq.unclaim()
                break
            self.waiting.popleft()
            seq.lane = adm.lane
            seq.phase = RESTORE if adm.restoring else PREFILL
            seq.prefill_pos = adm.cached
            seq.pending_ops = list(adm.ops)
            seq.stats.cached_tokens = adm.cached
            seq.stats.reuse_path = adm.path
            seq.t_admit = now
            adm.lane.tokens = list(seq.prompt[: adm.cached])
            self._plan_captures(seq)
            self.active.append(seq)
            admitted.append(seq)
        return admitted

    def _plan_captures(self, seq: Seq) -> None:
        if not self.cache.enabled or seq.lane is None:
            return
        lane = seq.lane
        wanted = ((TURN, seq.request.turn_checkpoint), (RESPONSE, seq.request.response_checkpoint))
        for kind, pos in wanted:
            if pos is None or pos <= 0 or pos > len(seq.prompt):
                continue
            if pos < seq.prefill_pos:
                continue  # behind the reuse frontier with no snapshot there: defer
            if pos == seq.prefill_pos:  # the resume point itself: snapshot before prefill
                seq.pending_ops.append(SlotOp(dst=lane.checkpoint_slots[kind], src=lane.live_slot))
                lane.checkpoints[kind] = pos
            else:
                seq.captures.setdefault(pos, []).append(kind)

    def restore_ended(self, seq: Seq, restored: bool) -> None:
        """The cold tier finished writing the request's lane: prefill from the admitted resume
        point, or (a failed restore) from the start of the prompt on the same lane and pages."""
        if seq.phase != RESTORE or seq.lane is None:
            return
        if not restored:
            lane = seq.lane
            lane.tokens, lane.computed, lane.checkpoints = [], 0, {}
            seq.prefill_pos = 0
            seq.pending_ops = [SlotOp(dst=lane.live_slot)]
            seq.captures = {}
            seq.stats.cached_tokens = 0
            seq.stats.reuse_path = "full_reset"
            self._plan_captures(seq)
        seq.phase = PREFILL

    # ----- planning -----
    def decode_ready(self) -> list[Seq]:
        return [s for s in self.active if s.phase == DECODE]

    def prefilling(self) -> list[Seq]:
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

    def _prefill_group(self, pre: list[Seq]) -> tuple[list[Seq], int | None]:
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
        for seq in pre[1:]:
            shape = self._chunk_shape(seq)
            if _graphable(seq) and fit([shape]) is not None:
                group.append(seq)
                shapes.append(shape)
        for n in range(len(group), 1, -1):
            q = fit(shapes[:n])
            if q is not None:
                return group[:n], q
        return pre[:1], None

    def _chunk_shape(self, seq: Seq) -> tuple[int, int, int]:
        """(tokens, start, pages held) of a prefilling request's next chunk."""
        assert seq.lane is not None
        start, end = self._chunk_bounds(seq)
        return end - start, start, len(seq.lane.pages)

    def _chunk_bounds(self, seq: Seq) -> tuple[int, int]:
        """[start, end) of a prefilling request's next chunk: at most `prefill_chunk` tokens,
        ending at the next checkpoint to capture."""
        start = seq.prefill_pos
        end = min(len(seq.prompt), start + self.prefill_chunk)
        cuts = [p for p in seq.captures if start < p < end]
        return start, min(cuts) if cuts else end

    def _prefill_plan(self, seq: Seq) -> PrefillPlan:
        assert seq.lane is not None
        lane = seq.lane
        start, end = self._chunk_bounds(seq)
        ops_after = [
            SlotOp(dst=lane.checkpoint_slots[k], src=lane.live_slot) for k in seq.captures.get(end, [])
        ]
        ops_before, seq.pending_ops = seq.pending_ops, []
        last = end == len(seq.prompt)
        scoring = seq.request.params.prompt_logprobs
        return PrefillPlan(
            seq_id=seq.id,
            tokens=list(seq.prompt[start:end]),
            start=start,
            slot=lane.live_slot,
            pages=lane.pages,
            ops_before=ops_before,
            ops_after=ops_after,
            sampler=seq.sampler if last and seq.entitlement > 0 else None,
            multimodal=seq.request.multimodal,
            prompt_logprobs=scoring,
            targets=list(seq.prompt[start + 1 : end + 1]) if scoring is not None else [],
        )

    def _decode_row(self, seq: Seq) -> DecodeRow:
        assert seq.lane is not None
        lane = seq.lane
        return DecodeRow(
            seq_id=seq.id,
            token=lane.tokens[lane.computed],
            position=lane.computed,
            slot=lane.live_slot,
            pages=lane.pages,
            sampler=seq.sampler,
            rope_delta=seq.request.multimodal.rope_delta if seq.request.multimodal is not None else 0,
        )

    # ----- applying results -----
    def prefill_done(self, seq: Seq, plan: PrefillPlan) -> None:
        """Record a finished chunk: the lane's computed frontier and captured checkpoints."""
        assert seq.lane is not None
        lane = seq.lane
        end = plan.start + len(plan.tokens)
        lane.tokens.extend(plan.tokens)
        lane.computed = end
        seq.prefill_pos = end
        for kind in seq.captures.pop(end, []):
            lane.checkpoints[kind] = end
        if end == len(seq.prompt):
            seq.phase = DECODE

    def decode_fed(self, seq: Seq) -> None:
        """The pending token of a decode row went through the model."""
        assert seq.lane is not None
        seq.lane.computed += 1

    def commit(self, seq: Seq, token: int) -> None:
        """Append a sampled token to the request's output and its lane ledger."""
        assert seq.lane is not None
        seq.generated.append(token)
        seq.lane.tokens.append(token)
        seq.sampler.observe(token)

    def finish(self, seq: Seq, keep: bool) -> None:
        """Remove a request (finished, cancelled or failed) from the queue or active set."""
        if seq.phase == WAITING:
            if seq in self.waiting:
                self.waiting.remove(seq)
        elif seq in self.active:
            self.active.remove(seq)
            assert seq.lane is not None
            self.cache.release(seq.lane, keep=keep)
        seq.phase = DONE

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


def _graphable(seq: Seq) -> bool:
    """Whether a request's chunks may run in a captured prefill graph: text, not scored (a
    scored chunk reads every position's logits, on the eager path)."""
    return seq.request.multimodal is None and seq.request.params.prompt_logprobs is None
