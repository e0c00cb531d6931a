"""The resident engine: one thread owns the model and every device tensor.

Other threads only `reserve()`, `submit()` and read/cancel their `RequestHandle`. The engine
thread loops: take new submissions and cancellations, expire late waiters, admit in FIFO order,
run one step (a prefill chunk of one request or one decode round of all decode-ready ones),
commit tokens and check stops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ninfer.engine.api import (
    ContextLengthExceeded,
    EngineError,
    EngineStopped,
    GenerationRequest,
    QueueTimeout,
    RequestStats,
    StepOutput,
)
from ninfer.engine.cold_tier import build_cold_tier, lane_pools
from ninfer.engine.config import EngineConfig
from ninfer.engine.counters import Counters
from ninfer.engine.handle import RequestHandle
from ninfer.engine.multimodal import MediaEncoder
from ninfer.engine.pages import PageAllocator, pages_for
from ninfer.engine.plan import DecodePlan, PrefillPlan
from ninfer.engine.prefix_cache import PrefixCache
from ninfer.engine.runner import Runner
from ninfer.engine.sampler import RowSampler, resolve_sampling
from ninfer.engine.scheduler import DECODE, Scheduler, Seq, Snapshot
from ninfer.engine.sizing import SizingLedger, mtp_kv_layers, resolve_kv
from ninfer.engine.slots import SlotLayout, make_lanes
from ninfer.engine.spec import counters as spec_counters
from ninfer.engine.spec.build import build_spec, check_spec, draft_slots
from ninfer.engine.stops import Detokenizer, StopChecker
from ninfer.engine.tickets import Ticket, TicketBook
from ninfer.model.cache import KVPool, StatePool, kv_storage_dtype

if TYPE_CHECKING:
    from ninfer.engine.cold_tier_store import ColdTierStore
    from ninfer.engine.spec.draft_head import DraftHead

log = logging.getLogger("ninfer.engine")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


class Engine:
    def __init__(
        self,
        model: Any,
        config: EngineConfig,
        detokenizer_factory: Callable[[], Detokenizer] | None = None,
        draft_head: DraftHead | None = None,
        vision: torch.nn.Module | None = None,
        cold_store: ColdTierStore | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self.text_config = model.config
        self.device = torch.device(config.device)
        self.dtype = _DTYPES[config.dtype]
        self.detokenizer_factory = detokenizer_factory
        check_spec(config, model, draft_head)
        # vision residency is frozen here: without a tower, multimodal requests are refused
        self.media = MediaEncoder(vision, self.device) if vision is not None else None
        self.layout = SlotLayout(lanes=config.max_concurrency, draft_slots=draft_slots(config))
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        self.ledger: SizingLedger = resolve_kv(
            self.text_config,
            config.kv_capacity,
            config.max_context,
            config.max_concurrency,
            config.prefill_chunk,
            self.layout.num_slots,
            self.dtype,
            self.device,
            weights,
            kv_storage_dtype(config.kv_dtype) if config.kv_dtype else None,
            mtp_layers=mtp_kv_layers(config),
            snapshot_slots=self.layout.lanes * self.layout.draft_slots,
        )
        self.kv = KVPool.for_config(
            self.text_config, self.ledger.num_pages, self.dtype, self.device, kv_dtype=config.kv_dtype
        )
        self.states = StatePool.for_config(self.text_config, self.layout.num_slots, self.dtype, self.device)
        self.allocator = PageAllocator(self.ledger.num_pages)
        self.cache = PrefixCache(make_lanes(self.layout), self.allocator, enabled=not config.no_prefix_reuse)
        self.scheduler = Scheduler(self.cache, config.max_concurrency, config.prefill_chunk)
        max_pages = pages_for(config.max_context)
        self.spec = build_spec(config, model, self.kv, self.states, self.layout, max_pages, draft_head)
        pools = lane_pools(self.kv, self.states, self.spec)  # cold tier: None without a secondary device
        self.cold_tier = self.cache.tier = build_cold_tier(config, pools, self.device, cold_store)
        self.runner = Runner(
            model,
            self.kv,
            self.states,
            max_pages,
            self.device,
            config.vocab_limit,
            max_batch=config.max_concurrency,
            cuda_graphs=not config.no_cuda_graph and self.spec is None,  # spec rounds run eagerly
            compile=config.compile,
            spec=self.spec,
            media=self.media,
        )
        self.tickets = TicketBook(
            config.max_concurrency + config.max_pending, config.pending_timeout_ms / 1000
        )
        self.counters = Counters()
        ids = config.stop_token_ids
        self.stop_token_ids = frozenset(self.text_config.eos_token_ids if ids is None else ids)
        self._cv = threading.Condition()
        self._inbox: list[Seq] = []
        self._cancels: set[int] = set()
        self._handles: dict[int, RequestHandle] = {}
        self._seqs: dict[int, Seq] = {}  # live requests (engine thread only)
        self._next_id = 0
        self._accepting = True
        self._drain_deadline: float | None = None
        self._snapshot = self.scheduler.snapshot()
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # set when the engine thread died; every request then fails
        self.prepared = threading.Event()  # set once the engine thread finished warm-up / graph capture

    @classmethod
    def from_settings(cls, settings: Any, artifact: Any) -> Engine:
        """Composition root: load the artifact's text model and build the engine from `Settings`."""
        from ninfer.engine.compose import engine_parts

        model, config, detok, draft_head = engine_parts(settings, artifact)
        vision = None
        if settings.vision.enabled:
            from ninfer.engine.compose import vision_tower

            vision = vision_tower(artifact, config)
        return cls(model, config, detok, draft_head, vision)

    # ----- caller threads -----
    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ninfer-engine", daemon=True)
            self._thread.start()
        return self

    def wait_prepared(self, timeout: float | None = None) -> bool:
        """Block until warm-up and CUDA graph capture are done (or the engine failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.prepared.wait(0.05):
            if self.error is not None:
                return False
            if deadline is not None and time.monotonic() > deadline:
                return False
        return True

    def reserve(self) -> Ticket:
        """A lifetime ticket; raises `EngineOverloaded` when max_concurrency + max_pending are live."""
        self._check_accepting()
        return self.tickets.reserve()

    def submit(self, ticket: Ticket, request: GenerationRequest) -> RequestHandle:
        """Queue a prepared prompt under `ticket`; validation errors raise here, synchronously."""
        now = time.monotonic()
        if ticket.released:
            raise ValueError("submit with a released ticket")
        if now >= ticket.deadline:
            raise QueueTimeout(f"request waited {now - ticket.created:.3f}s before submission")
        prompt = request.prompt_ids
        if not prompt:
            raise ValueError("empty prompt")
        vocab = self.text_config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"prompt token id outside the model vocabulary [0, {vocab})")
        mm = request.multimodal
        if mm is not None:
            if self.media is None:
                raise ValueError("media input needs an engine started with vision enabled")
            if tuple(mm.positions.shape) != (3, len(prompt)):
                raise ValueError(f"multimodal positions must be [3, {len(prompt)}]")
        ctx = self.config.max_context
        if len(prompt) + 1 > ctx:
            raise ContextLengthExceeded(len(prompt), ctx)
        params = request.params
        max_tokens = self.config.default_max_tokens if params.max_tokens is None else params.max_tokens
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        preset = self.config.thinking_preset if request.thinking else self.config.non_thinking_preset
        resolved = resolve_sampling(params, preset, self.config.sampling)
        stop_ids = (
            frozenset(params.stop_token_ids) if params.stop_token_ids is not None else self.stop_token_ids
        )
        if params.ignore_eos:
            stop_ids = frozenset()
        detok = self.detokenizer_factory() if self.detokenizer_factory is not None else None
        stats = RequestStats(
            prompt_tokens=len(prompt), resolved_sampling=resolved.as_dict(), seed=resolved.seed
        )
        if self.spec is not None:
            stats.speculative = spec_counters.new_counters(self.spec.backend, self.spec.k)
        with self._cv:  # checked under the lock: the drain loop exits only with an empty inbox
            self._check_accepting()
            self._next_id += 1
            sid = self._next_id
            seq = Seq(
                id=sid,
                request=request,
                ticket=ticket,
                entitlement=min(max_tokens, ctx - len(prompt)),
                sampler=RowSampler(resolved, self.device),
                stops=StopChecker(stop_ids, params.stop, detok),
                stats=stats,
                t_submit=now,
            )
            handle = RequestHandle(request.request_id, ticket, stats, lambda: self._cancel(sid))
            self._handles[sid] = handle
            self._inbox.append(seq)
            self._cv.notify()
        return handle

    def _check_accepting(self) -> None:
        if self.error is not None:
            raise EngineError(f"the engine failed: {self.error}")
        if not self._accepting:
            raise EngineStopped("the engine is shutting down")

    def _cancel(self, sid: int) -> None:
        with self._cv:
            self._cancels.add(sid)
            self._cv.notify()

    def snapshot(self) -> Snapshot:
        """Scheduler occupancy as of the last step boundary."""
        return self._snapshot

    def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Stop accepting; let in-flight requests finish within the bound, then cancel the rest."""
        with self._cv:
            self._accepting = False
            self._drain_deadline = time.monotonic() + drain_timeout_s
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # ----- engine thread -----
    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # outside a step: the engine cannot go on
            log.exception("the engine thread failed")
            self._die(f"{type(exc).__name__}: {exc}")

    def _die(self, error: str) -> None:
        """Record the fatal error, refuse new work and fail every live and queued request."""
        with self._cv:
            self.error = error
            self._accepting = False
            queued, self._inbox = self._inbox, []
            handles, self._handles = self._handles, {}
        for seq in [*self._seqs.values(), *queued]:
            try:
                self._drop_media(seq)
            except Exception:  # the payload references are released best-effort
                pass
        self._seqs.clear()
        for handle in handles.values():
            handle._put(EngineError(f"the engine failed: {error}"))

    def _serve(self) -> None:
        sched = self.scheduler
        self.runner.prepare()  # CUDA graph capture, on this thread, before any sequence exists
        self.prepared.set()
        while True:
            with self._cv:
                new, self._inbox = self._inbox, []
                cancels, self._cancels = self._cancels, set()
                drain_deadline = self._drain_deadline
            for seq in new:
                self._seqs[seq.id] = seq
                sched.enqueue(seq)
            for sid in cancels:
                seq = self._seqs.get(sid)
                if seq is not None:
                    self._end(seq, StepOutput(token_ids=(), finish_reason="cancelled"), keep=False)
            now = time.monotonic()
            if drain_deadline is not None:
                if now >= drain_deadline:
                    for seq in list(self._seqs.values()):
                        if seq.phase == DECODE or seq in sched.active:
                            self._end(seq, StepOutput(token_ids=(), finish_reason="cancelled"), keep=False)
                        else:
                            self._fail(seq, EngineStopped("the engine shut down before admission"))
                if not self._seqs:
                    self._snapshot = sched.snapshot()
                    return
            for seq in sched.expire(now):
                waited = now - seq.ticket.created
                self._fail(seq, QueueTimeout(f"request not admitted within {waited:.3f}s"))
            sched.admit(now)
            plan = sched.next_plan()
            self._snapshot = sched.snapshot()
            if plan is None:
                self._idle_wait(now)
            else:
                self._step(plan)

    def _idle_wait(self, now: float) -> None:
        deadlines = [s.ticket.deadline for s in self.scheduler.waiting]
        if self._drain_deadline is not None:
            deadlines.append(self._drain_deadline)
        timeout = max(0.0, min(deadlines) - now) if deadlines else 0.5
        with self._cv:
            if not self._inbox and not self._cancels and self._accepting:
                self._cv.wait(timeout)
            elif not self._inbox and not self._cancels:
                self._cv.wait(min(timeout, 0.05))

    def _step(self, plan: PrefillPlan | DecodePlan) -> None:
        sched = self.scheduler
        ids = [plan.seq_id] if isinstance(plan, PrefillPlan) else [r.seq_id for r in plan.rows]
        try:
            result = self.runner.execute(plan)
        except Exception as exc:  # a failed step fails its requests, not the engine
            for sid in ids:
                out = StepOutput(token_ids=(), finish_reason="error", error=f"{type(exc).__name__}: {exc}")
                self._end(self._seqs[sid], out, keep=False)
            return
        now = time.monotonic()
        if isinstance(plan, PrefillPlan):
            seq = self._seqs[plan.seq_id]
            sched.prefill_done(seq, plan)
            seq.stats.computed_prefill_tokens += len(plan.tokens)
            seq.stats.vision_s += result.vision_seconds
            if seq.phase == DECODE:
                self._drop_media(seq)  # the prompt is in the cache: its payloads are not needed
            self.counters.add(prefill_tokens=len(plan.tokens), prefill_seconds=result.seconds)
            if result.tokens:
                seq.t_first = now
                self._commit(seq, result.tokens[0], now)
            return
        spec = result.spec
        decoded, committed = 0, []
        for i, sid in enumerate(result.seq_ids):
            seq = self._seqs[sid]
            run = [result.tokens[i]] if spec is None else spec.runs[i]
            if spec is not None:
                spec_counters.begin_row(seq.stats.speculative, spec.drafted[i])
            n = 0  # a speculative run commits until the request finishes (stop or length)
            for token in run:
                if spec is not None and n < spec.accepted[i]:
                    spec_counters.commit_draft(seq.stats.speculative, n)
                sched.decode_fed(seq)
                n += 1
                if self._commit(seq, token, now):
                    break
            decoded += n
            retained = seq.lane is not None and seq.lane.computed > 0
            committed.append(n if retained else None)
        seconds = result.seconds
        if spec is not None:  # bring each retained lane's state to exactly its committed tokens
            try:
                seconds += spec.finalize(committed)
            except Exception as exc:
                self._drop_rows(plan, f"{type(exc).__name__}: {exc}")
        self.counters.add(
            decode_tokens=decoded,
            decode_rounds=1,
            decode_row_rounds=len(plan.rows),
            decode_seconds=seconds,
        )

    def _drop_rows(self, plan: DecodePlan, error: str) -> None:
        """A state fix-up failed: fail the rows' live requests and forget their retained lanes."""
        slots = {r.slot for r in plan.rows}
        for r in plan.rows:
            seq = self._seqs.get(r.seq_id)
            if seq is not None:
                self._end(seq, StepOutput(token_ids=(), finish_reason="error", error=error), keep=False)
        for lane in self.cache.lanes:
            if lane.live_slot in slots and lane.resident:
                self.allocator.free(lane.clear())

    def _commit(self, seq: Seq, token: int, now: float) -> bool:
        """Commit one token; True when it finished the request."""
        self.scheduler.commit(seq, token)
        try:
            text, hit = seq.stops.push(token)
            finish = None
            if hit is not None:
                finish = "stop"
            elif len(seq.generated) >= seq.entitlement:
                finish = "length"
                tail = seq.stops.flush()
                text = None if text is None else text + (tail or "")
        except ValueError as exc:  # e.g. a token id the tokenizer cannot decode
            out = StepOutput(token_ids=(token,), finish_reason="error", error=str(exc))
            self._end(seq, out, keep=False)
            return True
        out = StepOutput(
            token_ids=(token,),
            finish_reason=finish,
            stop_string=hit.string if hit is not None else None,
            stop_token_id=hit.token_id if hit is not None else None,
            text=text,
        )
        if finish is None:
            self._handles[seq.id]._put(out)
            return False
        self._end(seq, out, keep=True)
        return True

    def _close_stats(self, seq: Seq) -> None:
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
        if self.cold_tier is not None:  # cumulative tier counters, and whether this request restored
            st.cold_tier = {"restored": self.cold_tier.take_restored(seq.id), **self.cold_tier.stats()}

    def _drop_media(self, seq: Seq) -> None:
        mm = seq.request.multimodal
        if mm is not None:
            if self.media is not None:
                self.media.forget(mm)
            mm.close()

    def _end(self, seq: Seq, out: StepOutput, keep: bool) -> None:
        self._drop_media(seq)
        self.scheduler.finish(seq, keep=keep)
        self._close_stats(seq)
        del self._seqs[seq.id]
        self._handles.pop(seq.id)._put(out)

    def _fail(self, seq: Seq, exc: EngineError) -> None:
        self._drop_media(seq)
        self.scheduler.finish(seq, keep=False)
        self._close_stats(seq)
        del self._seqs[seq.id]
        self._handles.pop(seq.id)._put(exc)
