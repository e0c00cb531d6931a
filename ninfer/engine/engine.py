"""The resident engine: one thread owns the model and every device tensor.

Other threads only `reserve()`, `submit()` and read/cancel their `RequestHandle`. The engine
thread loops (`_tick`): take new submissions into the scheduler's table (the only table of live
`Request` records) and apply cancellations, expire late waiters, admit in FIFO order,
run one step (a prefill chunk of one request or one decode round of all decode-ready ones)
through one loop, launch -> resolve -> commit (`_step`), committing tokens and checking stops.
While the decode rows are its only work, each round is launched before the previous one is
resolved and committed (launch-ahead, a property of that loop). Between steps it moves the cold
tier's restores on, a chunk per round (`ColdTier.advance`). Submission checks live in `intake`,
token commits in `commit`, and how requests leave (finish, fail, engine death) in `retire`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from ninfer.engine.cold_tier import build_cold_tier, lane_pools
from ninfer.engine.commit import Committer
from ninfer.engine.config import EngineConfig
from ninfer.engine.counters import Counters
from ninfer.engine.grammar import Grammars, GrammarUnavailable
from ninfer.engine.graphs import GraphStats, default_capture
from ninfer.engine.handle import Outbox, RequestHandle
from ninfer.engine.intake import validate_request
from ninfer.engine.multimodal import MediaEncoder
from ninfer.engine.pages import PageAllocator, pages_for
from ninfer.engine.plan import DecodePlan, PrefillBatch, PrefillPlan, StepPlan, StepResult
from ninfer.engine.prefix_cache import PrefixCache
from ninfer.engine.request import DECODE, Request
from ninfer.engine.retire import Retirer
from ninfer.engine.runner import Runner, default_graph_segments
from ninfer.engine.sampler import RowSampler
from ninfer.engine.scheduler import Scheduler, Snapshot
from ninfer.engine.sizing import SizingLedger, mtp_kv_layers, resolve_kv
from ninfer.engine.slots import SlotLayout, make_lanes
from ninfer.engine.speculative.build import build_spec, check_spec, draft_slots
from ninfer.engine.stops import Detokenizer, StopChecker
from ninfer.engine.tickets import Ticket, TicketBook
from ninfer.engine.types import (
    ConstraintSpec,
    EngineError,
    EngineStopped,
    GenerationRequest,
    QueueTimeout,
    StepOutput,
)
from ninfer.engine.warmup import WarmupReport, warm_prefill, warm_sampling, warmup_chunks
from ninfer.kernels import jit_watch
from ninfer.model.cache import KVPool, StatePool, kv_storage_dtype

if TYPE_CHECKING:
    from ninfer.engine.cold_tier_store import ColdTierStore
    from ninfer.engine.speculative.draft_head import DraftHead
    from ninfer.model.dflash import DFlashDrafter

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
        grammars: Grammars | None = None,
        dflash: DFlashDrafter | None = None,
    ) -> None:
        self.config = config
        self.grammars = grammars  # grammar-constrained output (None: refused)
        self.model = model
        self.text_config = model.config
        self.device = torch.device(config.device)
        self.dtype = _DTYPES[config.dtype]
        self.detokenizer_factory = detokenizer_factory
        check_spec(config, model, draft_head, dflash)
        # vision residency is frozen here: without a tower, multimodal requests are refused
        self.media = MediaEncoder(vision, self.device) if vision is not None else None
        self.layout = SlotLayout(lanes=config.max_concurrency, draft_slots=draft_slots(config))
        weights = model.weight_bytes()
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
        max_pages = pages_for(config.max_context)
        capture = None if config.no_cuda_graph else default_capture(self.device)  # every graph's backend
        self.spec = build_spec(
            config,
            model,
            self.kv,
            self.states,
            self.layout,
            max_pages,
            draft_head,
            cuda_graph=capture is not None,
            dflash=dflash,
        )
        pools = lane_pools(self.kv, self.states, self.spec)  # cold tier: None when no arena is left
        self.cold_tier = build_cold_tier(config, pools, self.device, cold_store)
        self.cache = PrefixCache(
            make_lanes(self.layout), self.allocator, not config.no_prefix_reuse, self.cold_tier
        )
        self.scheduler = Scheduler(self.cache, config.max_concurrency, config.prefill_chunk)
        self.runner = Runner(
            model,
            self.kv,
            self.states,
            max_pages,
            self.device,
            config.vocab_limit,
            max_batch=config.max_concurrency,
            cuda_graph=capture is not None,  # with --spec: decode, verify and MTP proposal graphs
            capture=capture,
            compile=config.compile,
            graph_segments=config.graph_segments or default_graph_segments(self.text_config),
            spec=self.spec,
            media=self.media,
            prefill_buckets=config.prefill_graph_buckets,
            prefill_rows=config.prefill_graph_rows,
        )
        self.tickets = TicketBook(
            config.max_concurrency + config.max_pending, config.pending_timeout_ms / 1000
        )
        self.counters = Counters()
        ids = config.stop_token_ids
        self.stop_token_ids = frozenset(self.text_config.eos_token_ids if ids is None else ids)
        self._cv = threading.Condition()
        self._inbox: list[Request] = []  # submitted, not yet in the scheduler's table
        self._cancels: set[int] = set()
        self._next_id = 0
        self._accepting = True
        self._drain_deadline: float | None = None
        self._snapshot = self.scheduler.snapshot()
        self._outbox = Outbox()  # token outputs wait for the next step's launch (see Outbox)
        self._retire = Retirer(
            self.scheduler, self.cache, self.allocator, self.media, self.cold_tier, self._outbox
        )
        self._commit = Committer(
            self.scheduler, self.counters, self._retire, self._outbox, self.runner.settle
        )
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # set when the engine thread died; every request then fails
        self.ready = threading.Event()  # set once the engine thread finished warm-up / graph capture
        self.warmup: WarmupReport | None = None  # the prefill warm-up before ready (None: not run)
        self.compiles_at_ready = 0  # jit_watch.count() when ready (late_compiles counts from it)
        self._kernels_at_ready: dict[str, int] = {}
        jit_watch.install()

    # ----- caller threads -----
    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ninfer-engine", daemon=True)
            self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until warm-up and CUDA graph capture are done (or the engine failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ready.wait(0.05):
            if self.error is not None:
                return False
            if deadline is not None and time.monotonic() > deadline:
                return False
        return True

    def check_constraint(self, spec: ConstraintSpec) -> None:
        """Compile (and cache) a request's grammar on the caller's thread, before admission;
        raises `GrammarError` (`GrammarUnavailable` when this engine cannot constrain output)."""
        if self.grammars is None:
            raise GrammarUnavailable(spec.param, "constrained output needs an engine with a tokenizer")
        self.grammars.compiled(spec)

    def reserve(self) -> Ticket:
        """A lifetime ticket; raises `EngineOverloaded` when max_concurrency + max_pending are live."""
        self._check_accepting()
        return self.tickets.reserve()

    def submit(self, ticket: Ticket, request: GenerationRequest) -> RequestHandle:
        """Queue a prepared prompt under `ticket`; validation errors raise here, synchronously."""
        now = time.monotonic()
        intake = validate_request(
            request,
            ticket,
            now,
            config=self.config,
            vocab_size=self.text_config.vocab_size,
            has_media=self.media is not None,
            default_stop_ids=self.stop_token_ids,
            detokenizer_factory=self.detokenizer_factory,
            spec=self.spec,
            grammars=self.grammars,
        )
        with self._cv:  # checked under the lock: the drain loop exits only with an empty inbox
            self._check_accepting()
            self._next_id += 1
            sid = self._next_id
            handle = RequestHandle(request.request_id, ticket, intake.stats, lambda: self._cancel(sid))
            self._inbox.append(
                Request(
                    id=sid,
                    submitted=request,
                    handle=handle,
                    entitlement=intake.entitlement,
                    sampler=RowSampler(
                        intake.sampling,
                        self.device,
                        logprobs=request.params.logprobs,
                        constraint=intake.constraint,
                    ),
                    stops=StopChecker(intake.stop_ids, request.params.stop, intake.detok),
                    t_submit=now,
                    compiles_at_submit=jit_watch.count(),
                )
            )
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

    def late_compiles(self) -> int:
        """Kernels and graphs compiled since the engine reported ready (0 on a warmed server)."""
        return jit_watch.count() - self.compiles_at_ready if self.ready.is_set() else 0

    def late_kernels(self) -> dict[str, int]:
        """Triton kernels specialised since ready, by name (what a warm-up missed)."""
        now, then = jit_watch.by_name(), self._kernels_at_ready
        return (
            {k: n - then.get(k, 0) for k, n in now.items() if n > then.get(k, 0)}
            if self.ready.is_set()
            else {}
        )

    def snapshot(self) -> Snapshot:
        """Scheduler occupancy as of the last step boundary."""
        return self._snapshot

    def graph_stats(self) -> GraphStats | None:
        """Captured CUDA graphs and what capture cost (None on the CPU or with graphs off)."""
        return self.runner.graph_stats

    def cold_tier_stats(self) -> dict[str, Any] | None:
        """The cold tier's counters and arena occupancy (None when no tier is active)."""
        return None if self.cold_tier is None else self.cold_tier.stats()

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
        self._retire.fail_all(queued, error)

    def _serve(self) -> None:
        self._warm_up()
        self.ready.set()
        while self._tick():
            pass

    def _warm_up(self) -> None:
        """Capture the graphs and warm the prefill and sampling kernels, on this thread, before
        any request exists."""
        self.runner.capture_graphs()
        # short next chunks of several requests: one replay of a captured prefill graph
        self.scheduler.prefill_fit = self.runner.prefill_bucket
        warm = self.config.prefill_warmup
        if warm or (warm is None and self.device.type == "cuda"):
            chunks = warmup_chunks(self.config.prefill_chunk, self.config.max_context)
            vocab = self.config.vocab_limit or self.text_config.vocab_size
            with self.model.one_layer_per_kind() as thin:  # every kernel, a fraction of the time
                self.warmup = warm_prefill(self.runner.execute, chunks, vocab, thin=thin)
            warm_sampling(self.device, self.text_config.vocab_size, self.config.max_concurrency)
            if self.grammars is not None:
                self.grammars.build_tables()  # ~2 s of tokenizer tables, not in the first constrained request
            log.info(
                "prefill warm-up: %d chunks in %.1fs%s",
                self.warmup.chunks,
                self.warmup.seconds,
                " (one decoder layer of each kind)" if thin else "",
            )
        self.compiles_at_ready = jit_watch.count()
        self._kernels_at_ready = jit_watch.by_name()

    def _tick(self) -> bool:
        """One turn of the engine loop; False once a drain has emptied the engine."""
        sched = self.scheduler
        now, drain_deadline = self._take_inbox()
        if drain_deadline is not None and self._drained(now, drain_deadline):
            return False
        for req in sched.expire(now):
            self._retire.fail(
                req, QueueTimeout(f"request not admitted within {now - req.ticket.created:.3f}s")
            )
        sched.admit(now)
        self._advance_restores()
        plan = sched.next_plan()
        self._snapshot = sched.snapshot()
        if plan is not None:
            self._step(plan)
        else:
            self._idle(now)
        return True

    def _take_inbox(self) -> tuple[float, float | None]:
        """New submissions into the scheduler's table, cancellations applied; -> (the time after,
        the drain deadline read with the inbox: a drain ends only with an empty inbox)."""
        with self._cv:
            new, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, set()
            drain_deadline = self._drain_deadline
        for req in new:
            self.scheduler.enqueue(req)
        for rid in cancels:
            cancelled = self.scheduler.get(rid)
            if cancelled is not None:
                self._retire.end(cancelled, StepOutput(token_ids=(), finish_reason="cancelled"), keep=False)
        return time.monotonic(), drain_deadline

    def _drained(self, now: float, deadline: float) -> bool:
        """A drain is under way: past its deadline, cancel what runs and fail what waits; True
        once no request is left (the last outputs delivered)."""
        sched = self.scheduler
        if now >= deadline:
            for req in list(sched.by_id.values()):
                if req.phase == DECODE or req in sched.active:
                    self._retire.end(req, StepOutput(token_ids=(), finish_reason="cancelled"), keep=False)
                else:
                    self._retire.fail(req, EngineStopped("the engine shut down before admission"))
        if sched.by_id:
            return False
        self._outbox.flush()
        self._snapshot = sched.snapshot()
        return True

    def _idle(self, now: float) -> None:
        """Nothing to launch: deliver the last round's tokens, then wait for work (not while the
        cold tier is restoring: its rounds go on)."""
        self._outbox.flush()
        if self.cold_tier is None or not self.cold_tier.restoring:
            self._idle_wait(now)

    def _advance_restores(self) -> None:
        """Move the cold tier's restores one round on (a decode step's worth of bytes while other
        rows run); a request whose lane is written goes on to prefill."""
        tier, sched = self.cold_tier, self.scheduler
        if tier is None or not tier.restoring:
            return
        busy = bool(sched.decode_ready() or sched.prefilling())
        for rid, restored in tier.advance(busy):
            req = sched.get(rid)
            if req is not None:
                sched.restore_ended(req, restored)

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

    def _step(self, plan: StepPlan) -> None:
        """Run `plan` through the one loop: launch, resolve, commit.

        Launch-ahead: while the same decode rows stay the only work (`_rounds_continue`) and the
        runner can feed them on the device (`can_launch_ahead`: plain decode, no host-side
        sampling), round N+1 goes to the device fed by round N's sampled tokens before round N is
        resolved, so the GPU runs it while the host commits, checks stops and delivers outputs. A
        request that finishes in round N has its last token fed by round N+1: its lane is retained
        with that token computed (the state and KV written by round N+1 are exactly that), and its
        row's output of round N+1 is dropped. The rounds stop when anything else needs the engine
        (a submission, a cancel, a waiting or prefilling request, a drain, a finished row); every
        launched round is resolved and committed before returning. Other kinds (prefill chunks,
        speculative rounds, rows sampled on the host) launch and resolve back to back.

        A failed launch or resolve fails that plan's rows (a round launched ahead of it is
        resolved first and its rows, the same, fail with it), never the engine."""
        runner, ahead = self.runner, self.config.launch_ahead
        ids = _row_ids(plan)
        try:
            cur = runner.launch(plan, on_launch=self._outbox.flush)
        except Exception as exc:
            self._fail_rows(ids, exc)
            return
        fed = False  # a round of this loop was launched ahead
        while True:
            nxt = None
            try:
                if ahead and runner.can_launch_ahead(plan) and self._rounds_continue(plan):
                    nxt = runner.launch(_next_round(plan), feed=cur, on_launch=self._outbox.flush)
                result = runner.resolve(cur)
            except Exception as exc:
                if nxt is not None:  # its rows fail with this round's; let it finish first
                    try:
                        runner.resolve(nxt)
                    except Exception:  # the same failure, already reported
                        pass
                self._fail_rows(ids, exc)
                return
            self._commit_step(plan, result, ahead=nxt is not None)
            fed = fed or nxt is not None
            if fed:
                self._snapshot = self.scheduler.snapshot()
            if nxt is None:
                return
            plan, cur = nxt.plan, nxt

    def _commit_step(self, plan: StepPlan, result: StepResult, ahead: bool) -> None:
        now = time.monotonic()
        if isinstance(plan, PrefillPlan):
            self._commit.prefill([plan], result, now)
        elif isinstance(plan, PrefillBatch):
            self._commit.prefill(plan.chunks, result, now)
        else:
            self._commit.decode(plan, result, now, ahead=ahead)

    def _fail_rows(self, ids: list[int], exc: Exception) -> None:
        """A failed step fails its live requests, not the engine."""
        self._retire.error_rows(ids, f"{type(exc).__name__}: {exc}")

    def _rounds_continue(self, plan: DecodePlan) -> bool:
        """Whether the next step would be `plan`'s rows again: every row's request is live and
        decoding, nothing waits, prefills, is submitted or cancelled, and no drain is under way."""
        sched = self.scheduler
        if sched.waiting or self._drain_deadline is not None or len(sched.active) != len(plan.rows):
            return False
        if any(sched.get(r.seq_id) is None for r in plan.rows):  # with the count: no prefill
            return False
        with self._cv:
            return not self._inbox and not self._cancels


def _row_ids(plan: StepPlan) -> list[int]:
    """The requests a plan's step serves (they fail together when it fails)."""
    if isinstance(plan, PrefillPlan):
        return [plan.seq_id]
    if isinstance(plan, PrefillBatch):
        return [c.seq_id for c in plan.chunks]
    return [r.seq_id for r in plan.rows]


def _next_round(plan: DecodePlan) -> DecodePlan:
    """The round after `plan` over the same rows: one position on, inputs fed on the device."""
    return DecodePlan(rows=[replace(r, token=-1, cached=r.cached + 1) for r in plan.rows])
