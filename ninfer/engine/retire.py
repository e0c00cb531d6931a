"""How live requests leave the engine: media release, scheduler finish, closed stats, the last output."""

from __future__ import annotations

import time
from collections.abc import Iterable

from ninfer.engine.cold_tier import ColdTier
from ninfer.engine.handle import Outbox
from ninfer.engine.multimodal import MediaEncoder
from ninfer.engine.pages import PageAllocator
from ninfer.engine.plan import DecodePlan
from ninfer.engine.prefix_cache import PrefixCache
from ninfer.engine.request import Request
from ninfer.engine.scheduler import Scheduler
from ninfer.engine.types import EngineError, StepOutput
from ninfer.kernels import jit_watch


def close_stats(req: Request, cold_tier: ColdTier | None) -> None:
    """Fill the request's token count and timings (and cold-tier counters) as of now."""
    now = time.monotonic()
    st = req.stats
    st.completion_tokens = len(req.generated)
    st.total_s = now - req.t_submit
    if req.t_admit:
        st.queue_s = req.t_admit - req.t_submit
    else:
        st.queue_s = st.total_s
    if req.t_first:
        st.ttft_s = req.t_first - req.t_submit
        st.prefill_s = req.t_first - req.t_admit
        st.decode_s = now - req.t_first
    st.compilations = jit_watch.count() - req.compiles_at_submit
    if cold_tier is not None:  # cumulative tier counters, and whether this request restored
        st.cold_tier = {"restored": cold_tier.take_restored(req.id), **cold_tier.stats()}


class Retirer:
    """Removes requests from the scheduler's table and delivers their last item to their handle."""

    def __init__(
        self,
        scheduler: Scheduler,
        cache: PrefixCache,
        allocator: PageAllocator,
        media: MediaEncoder | None,
        cold_tier: ColdTier | None,
        outbox: Outbox,
    ) -> None:
        self.outbox = outbox  # last items go out at once, after whatever is pending
        self.scheduler = scheduler
        self.cache = cache
        self.allocator = allocator
        self.media = media
        self.cold_tier = cold_tier

    def drop_media(self, req: Request) -> None:
        """Release the request's media payloads (and the encoder's cached rows for them)."""
        mm = req.submitted.multimodal
        if mm is not None:
            if self.media is not None:
                self.media.forget(mm)
            mm.close()

    def end(self, req: Request, out: StepOutput, keep: bool) -> None:
        """Finish `req` with a final output; `keep` retains its lane for prefix reuse."""
        self._retire(req, keep)
        self.outbox.put_now(req.handle, out)

    def fail(self, req: Request, exc: EngineError) -> None:
        """Finish `req` by raising `exc` on its handle."""
        self._retire(req, keep=False)
        self.outbox.put_now(req.handle, exc)

    def _retire(self, req: Request, keep: bool) -> None:
        self.drop_media(req)
        if self.cold_tier is not None:  # a restore under way stops before the lane is released
            self.cold_tier.abort(req.id)
        self.scheduler.finish(req, keep=keep)
        close_stats(req, self.cold_tier)

    def error_rows(self, seq_ids: Iterable[int], error: str) -> None:
        """A step failed: end its still-live requests with `error` (the engine goes on)."""
        for sid in seq_ids:
            req = self.scheduler.get(sid)
            if req is not None:
                self.end(req, StepOutput(token_ids=(), finish_reason="error", error=error), keep=False)

    def drop_rows(self, plan: DecodePlan, error: str) -> None:
        """A state fix-up failed: fail the rows' live requests and forget their retained lanes."""
        slots = {r.slot for r in plan.rows}
        self.error_rows([r.seq_id for r in plan.rows], error)
        for lane in self.cache.lanes:
            if lane.live_slot in slots and lane.resident:
                self.allocator.free(lane.clear())

    def fail_all(self, queued: Iterable[Request], error: str) -> None:
        """The engine died: release the media of every live and queued request (best effort) and
        fail every handle; the table is left empty."""
        doomed = [*self.scheduler.by_id.values(), *queued]
        self.scheduler.by_id.clear()
        for req in doomed:
            try:
                self.drop_media(req)
            except Exception:  # the payload references are released best-effort
                pass
            self.outbox.put_now(req.handle, EngineError(f"the engine failed: {error}"))
