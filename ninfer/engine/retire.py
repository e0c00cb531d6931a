"""How live requests leave the engine: media release, scheduler finish, closed stats, the last output."""

from __future__ import annotations

import time
from collections.abc import Iterable

from ninfer.engine.cold_tier import ColdTier
from ninfer.engine.handle import Outbox, RequestHandle
from ninfer.engine.multimodal import MediaEncoder
from ninfer.engine.pages import PageAllocator
from ninfer.engine.plan import DecodePlan
from ninfer.engine.prefix_cache import PrefixCache
from ninfer.engine.scheduler import Scheduler, Seq
from ninfer.engine.types import EngineError, StepOutput
from ninfer.kernels import jit_watch


def close_stats(seq: Seq, cold_tier: ColdTier | None) -> None:
    """Fill the request's token count and timings (and cold-tier counters) as of now."""
    now = time.monotonic()
    st = seq.stats
    st.completion_tokens = len(seq.generated)
    st.total_s = now - seq.t_submit
    if seq.t_admit:
        st.queue_s = seq.t_admit - seq.t_submit
    else:
        st.queue_s = st.total_s
    if seq.t_first:
        st.ttft_s = seq.t_first - seq.t_submit
        st.prefill_s = seq.t_first - seq.t_admit
        st.decode_s = now - seq.t_first
    st.compilations = jit_watch.count() - seq.compiles_at_submit
    if cold_tier is not None:  # cumulative tier counters, and whether this request restored
        st.cold_tier = {"restored": cold_tier.take_restored(seq.id), **cold_tier.stats()}


class Retirer:
    """Removes requests from the engine thread's live table (`seqs`) and delivers their last item.

    `seqs` and `handles` are the engine's own dicts, shared by reference; callers add to
    `handles` under the engine's lock, only the engine thread removes.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        cache: PrefixCache,
        allocator: PageAllocator,
        media: MediaEncoder | None,
        cold_tier: ColdTier | None,
        seqs: dict[int, Seq],
        handles: dict[int, RequestHandle],
        outbox: Outbox,
    ) -> None:
        self.outbox = outbox  # last items go out at once, after whatever is pending
        self.scheduler = scheduler
        self.cache = cache
        self.allocator = allocator
        self.media = media
        self.cold_tier = cold_tier
        self.seqs = seqs
        self.handles = handles

    def drop_media(self, seq: Seq) -> None:
        """Release the request's media payloads (and the encoder's cached rows for them)."""
        mm = seq.request.multimodal
        if mm is not None:
            if self.media is not None:
                self.media.forget(mm)
            mm.close()

    def end(self, seq: Seq, out: StepOutput, keep: bool) -> None:
        """Finish `seq` with a final output; `keep` retains its lane for prefix reuse."""
        self._retire(seq, keep)
        self.outbox.put_now(self.handles.pop(seq.id), out)

    def fail(self, seq: Seq, exc: EngineError) -> None:
        """Finish `seq` by raising `exc` on its handle."""
        self._retire(seq, keep=False)
        self.outbox.put_now(self.handles.pop(seq.id), exc)

    def _retire(self, seq: Seq, keep: bool) -> None:
        self.drop_media(seq)
        if self.cold_tier is not None:  # a restore under way stops before the lane is released
            self.cold_tier.abort(seq.id)
        self.scheduler.finish(seq, keep=keep)
        close_stats(seq, self.cold_tier)
        del self.seqs[seq.id]

    def error_rows(self, seq_ids: Iterable[int], error: str) -> None:
        """A step failed: end its still-live requests with `error` (the engine goes on)."""
        for sid in seq_ids:
            seq = self.seqs.get(sid)
            if seq is not None:
                self.end(seq, StepOutput(token_ids=(), finish_reason="error", error=error), keep=False)

    def drop_rows(self, plan: DecodePlan, error: str) -> None:
        """A state fix-up failed: fail the rows' live requests and forget their retained lanes."""
        slots = {r.slot for r in plan.rows}
        self.error_rows([r.seq_id for r in plan.rows], error)
        for lane in self.cache.lanes:
            if lane.live_slot in slots and lane.resident:
                self.allocator.free(lane.clear())

    def fail_all(self, queued: Iterable[Seq], handles: Iterable[RequestHandle], error: str) -> None:
        """The engine died: release every live and queued request's media and fail every handle."""
        for seq in [*self.seqs.values(), *queued]:
            try:
                self.drop_media(seq)
            except Exception:  # the payload references are released best-effort
                pass
        self.seqs.clear()
        for handle in handles:
            self.outbox.put_now(handle, EngineError(f"the engine failed: {error}"))
