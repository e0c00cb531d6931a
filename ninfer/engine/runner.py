"""Executes a StepPlan against the model and the pools; the only code that touches device tensors."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

import torch

from ninfer.engine.graphs import CaptureBackend, GraphStats, InstallCut, StepGraphs, default_capture
from ninfer.engine.pages import pages_for
from ninfer.engine.penalty_counts import PenaltyCounts
from ninfer.engine.plan import DecodePlan, PrefillBatch, PrefillPlan, SlotOp, StepPlan, StepResult
from ninfer.engine.prompt_logprobs import score_positions
from ninfer.engine.sampler import LogprobRows, check_drawn, sample_rows_full, sample_with_logprobs
from ninfer.engine.step_io import StepOut, StepRows, host_buffer, pack, pack_rows, packed_len, unpack
from ninfer.model.cache import ForwardBatch, KVPool, StatePool
from ninfer.model.config import TextConfig

if TYPE_CHECKING:
    from ninfer.engine.multimodal import MediaEncoder
    from ninfer.engine.speculative.decoder import SpecDecoder


log = logging.getLogger("ninfer.engine.runner")

SMALL_MOE_TOKENS, SMALL_MOE_ROWS = 64, 384  # the small-batch MoE kernels' limits (triton/moe.py)
# The conv step kernel takes at most 64 tokens (triton backend CONV_STEP_MAX_T); longer per-token
# steps take the torch reference, which does not capture on the H200 (a 48 bucket, f917fd5).
SMALL_STEP_MAX_TOKENS = 64
MOE_GRAPH_SEGMENTS = 8  # MoE models' captured steps: this many groups of decoder layers (see CaptureBackend)


def default_graph_segments(config: TextConfig) -> int:
    """Segments of a captured step when the engine config leaves it open. Measured on the H200:
    the 35B-A3B's batch-8 decode round took 7.90 ms in 8 segments against 8.91 ms as one graph
    (its ~770 small kernels launch for ~1.3 ms); the 27B dense step, whose launch hides behind its
    GPU time, was no faster in segments and the engine's step ~0.2 ms slower."""
    return MOE_GRAPH_SEGMENTS if config.is_moe else 1


@dataclass
class Launched:
    """A step queued on the device by `Runner.launch`, read back by `Runner.resolve`.

    A plain decode round is left in flight: its sampled tokens stay on the device (`tokens`,
    what a next round may be fed) and an async copy fills `host`. Every other kind (prefill
    chunks, speculative rounds) is read back by `launch` itself and carries its `result`."""

    plan: StepPlan
    t0: float
    result: StepResult | None = None  # already read back: nothing left in flight
    tokens: torch.Tensor | None = None  # [B] int64 on the device: the sampled tokens
    host: torch.Tensor | None = None  # [B] (or [2B]: tokens | bad flags) int64 on the host, async copy
    checked: bool = False  # `host` carries the bad flags of stochastic rows after the tokens
    ready: torch.cuda.Event | None = None  # recorded after the copy (None on the CPU: already done)
    logprobs: LogprobRows | None = None  # rows with logprobs (such rounds are never launched ahead)


class Runner:
    """Builds `ForwardBatch`es (one host->device copy each), runs the model, samples.

    Shapes are static per batch size: the page table is always `max_pages` wide (the pages of
    one max_context sequence). Decode batches of 1..max_batch rows replay CUDA graphs captured by
    `capture_graphs()` (before the first step) unless `cuda_graph` is off or the device is the CPU; with
    a speculative decoder that allows graphs, verification (q = k + 1) is captured too, as are
    the drafter's own graphs (one manager, `StepGraphs`), and the decoder runs every target
    forward through `forward`. `compile` installs the model's compiled layer steps (one
    `torch.compile` per decoder-layer kind, shared by its layers: `Qwen35Model.compile_layers`),
    which the captured graphs record like the eager layers. Every step goes `launch` -> `resolve`
    (see `launch`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        kv: KVPool,
        states: StatePool,
        max_pages: int,
        device: torch.device,
        vocab_limit: int | None = None,
        *,
        max_batch: int = 1,
        cuda_graph: bool = True,
        compile: bool = False,
        capture: CaptureBackend | None = None,
        graph_segments: int = 1,
        spec: SpecDecoder | None = None,
        media: MediaEncoder | None = None,
        prefill_buckets: Sequence[int] = (),
        prefill_rows: int | None = None,
    ) -> None:
        self.model = model
        self.prefill_buckets = small_prefill_buckets(prefill_buckets, model.config)
        rows = max_batch if prefill_rows is None else max(1, min(prefill_rows, max_batch))
        self.prefill_shapes = prefill_graph_shapes(self.prefill_buckets, model.config, rows)
        self.media = media  # vision: multimodal prefill chunks (None = text only)
        self.spec = spec  # speculative decoding: decode rounds go through it, slot ops and prefill feed it
        self.vocab_limit = vocab_limit
        self.kv = kv
        self.states = states
        self.max_pages = max_pages
        self.device = device
        self.max_batch = max_batch
        self.penalties = PenaltyCounts(max_batch, device)  # decode rounds' penalty counts, per lane
        # capture: None = CUDA graphs on a GPU; a backend is given by tests (e.g. EagerCapture)
        if capture is None:
            capture = default_capture(device)
        self._capture = capture if cuda_graph else None
        self._compiled = compile
        self.graph_segments = graph_segments  # layer groups per captured step (1: one graph)
        if compile:
            model.compile_layers(recompile_limit=_recompile_limit(max_batch))
        if spec is not None:
            spec.bind(self.forward)
        self.graphs: StepGraphs | None = None
        self.graph_stats: GraphStats | None = None
        self._on_launch: Callable[[], None] | None = None  # the running launch's (see launch)
        self._capture_ran = False
        self._steps = 0
        self._resolved_at = 0.0  # perf_counter of the last `resolve`

    def capture_graphs(self) -> GraphStats | None:
        """Capture every graph through the one manager (`StepGraphs`): the step's decode, verify
        and prefill shapes and the drafter's proposal graphs; must run before the first step
        (warm-up writes scratch state). Idempotent; a failed capture leaves its graphs eager and
        says why in `graph_stats`."""
        if self._capture_ran:
            return self.graph_stats
        if self._steps:
            raise RuntimeError("Runner.capture_graphs() must run before the first step")
        self._capture_ran = True
        if self._capture is None or (self.spec is not None and not self.spec.graphable):
            return None
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)  # the engine thread starts on the default device
        cfg = self.model.config
        dtype = self.model.dtype
        verify_q = None if self.spec is None else self.spec.k + 1
        try:
            graphs = StepGraphs(
                self._forward_logits, self.max_batch, self.max_pages, cfg.vocab_size, cfg.hidden_size,
                dtype, self.device, self._capture, verify_q, self._layer_cuts(), self.prefill_shapes,
            )  # fmt: skip
        except Exception as exc:  # e.g. no memory left for the static logits buffer
            self.graph_stats = GraphStats((), 0.0, 0, f"{type(exc).__name__}: {exc}"[:300])
            return self.graph_stats
        if self.spec is not None:
            self.spec.add_graphs(graphs)  # the MTP proposal: captured with the step's graphs
        with torch.inference_mode():
            self.graph_stats = graphs.capture()
        failed = _capture_error(self.graph_stats) if self._compiled else None
        if failed is not None:  # the compiled layers run in every captured family and eager path
            return self._eager_fallback(failed)
        if self.graph_stats.error is None:
            self.graphs = graphs
        if self._compiled:
            self.graph_stats.graph_breaks = _graph_breaks()
        return self.graph_stats

    def _eager_fallback(self, error: str) -> GraphStats | None:
        """A compiled layer step failed while the graphs were captured (before ready): log one
        line, run the eager layers from now on and capture again."""
        log.warning("torch.compile of the layer steps failed at startup, the eager layers run: %s", error)
        self.model.eager_layers()
        self._compiled = False
        self._capture_ran = False
        stats = self.capture_graphs()
        if stats is not None:
            stats.compile_error = error
        return stats

    def _layer_cuts(self) -> InstallCut | None:
        """Cuts the captured step after every len(layers) / graph_segments decoder layers (the
        model's `layer_hook`, called between the layer steps, compiled or not); none for one
        segment."""
        model = self.model
        if self.graph_segments <= 1:
            return None
        n = len(model.layers)
        every = -(-n // self.graph_segments)

        def install(cut: Callable[[], None] | None) -> None:
            def hook(i: int) -> None:
                if (i + 1) % every == 0 and i + 1 < n:
                    cut()  # type: ignore[misc]

            model.layer_hook = None if cut is None else hook

        return install

    def can_launch_ahead(self, plan: StepPlan) -> TypeGuard[DecodePlan]:
        """Whether `launch` can feed this plan's next round its inputs on the device: a plain
        decode round (no speculative decoder) with no row whose logits depend on its tokens on
        the host (grammar masks; penalties count on the device) or that reads logprobs back."""
        return (
            isinstance(plan, DecodePlan)
            and self.spec is None
            and not any(r.sampler.host_bound for r in plan.rows)
        )

    def launch(
        self, plan: StepPlan, feed: Launched | None = None, on_launch: Callable[[], None] | None = None
    ) -> Launched:
        """Queue one step on the device; `resolve` reads it back.

        A plain decode round is queued with the copy of its sampled tokens to the host, without
        waiting. Other kinds run to their result here (their forwards feed host-side work).
        `feed`: the round before, still in flight, over the same rows in the same order (only
        where `can_launch_ahead`); its sampled tokens become this round's inputs on the device
        (the rows' `token` fields are not read). `on_launch` is called once, as soon as the step's
        GPU work is queued (after a graph replay's launch; before an eager forward, whose launches
        are the host's work), so host work on the caller's side overlaps the GPU; at the latest
        before returning."""
        if feed is not None:
            fed_by = feed.plan
            if not (
                self.can_launch_ahead(plan) and isinstance(fed_by, DecodePlan) and feed.tokens is not None
            ):
                raise ValueError("only plain decode rounds are fed by the round before them")
            if [r.seq_id for r in fed_by.rows] != [r.seq_id for r in plan.rows]:
                raise ValueError("a fed round must have the rows of the round that feeds it, in order")
        t0 = self._begin()
        self._on_launch = on_launch
        try:
            with torch.inference_mode():
                if isinstance(plan, DecodePlan) and self.spec is None:
                    return self._launch_decode(plan, None if feed is None else feed.tokens, t0)
                if isinstance(plan, PrefillPlan):
                    result = self._prefill(plan)
                elif isinstance(plan, PrefillBatch):
                    result = self._prefill_rows(plan.chunks, plan.q)
                else:
                    result = self.spec.decode(plan)  # type: ignore[union-attr]
        finally:
            self._launched()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        result.seconds = time.perf_counter() - t0
        return Launched(plan, t0, result)

    def _launch_decode(self, plan: DecodePlan, feed: torch.Tensor | None, t0: float) -> Launched:
        rows = plan.rows
        step = self.forward(StepRows.for_decode(rows, [[r.token] for r in rows]), feed)
        # the in-graph argmax is a view of a static buffer: the copies below and a next round's
        # feed are queued before the next replay overwrites it
        logits, counted = self.penalties.penalize(step.logits[:, -1], rows)  # [B, V]
        argmax = step.last_argmax() if counted is None else None
        tokens, bad, lp = sample_rows_full(logits, [r.sampler for r in rows], argmax, penalized=True)
        self.penalties.add(counted, tokens)  # on the device: a round launched next reads them
        flat = tokens if bad is None else torch.cat([tokens, bad])  # [B] or [2B]
        on_gpu = self.device.type == "cuda"
        host = torch.empty(flat.shape, dtype=torch.int64, pin_memory=on_gpu)
        host.copy_(flat, non_blocking=on_gpu)
        ready = None
        if on_gpu:
            ready = torch.cuda.Event()
            ready.record()
        return Launched(plan, t0, None, tokens, host, bad is not None, ready, lp)

    def resolve(self, launched: Launched) -> StepResult:
        """Wait for a launched step's tokens (not for rounds queued after it) and return them."""
        if launched.result is not None:
            return launched.result
        assert launched.host is not None and isinstance(launched.plan, DecodePlan)
        if launched.ready is not None:
            launched.ready.synchronize()
        values = launched.host.tolist()
        tokens = check_drawn(values) if launched.checked else values
        seq_ids = [r.seq_id for r in launched.plan.rows]
        now = time.perf_counter()
        # a round launched ahead runs from the end of the one before it: decode seconds add up to wall time
        seconds = now - max(launched.t0, self._resolved_at)
        self._resolved_at = now
        lp = None
        if launched.logprobs is not None:
            lp = launched.logprobs.read(tokens, [r.sampler for r in launched.plan.rows], len(tokens))
        result = StepResult.sampled(seq_ids, tokens, lp)
        result.seconds = seconds
        return result

    def settle(self, result: StepResult, committed: list[int | None]) -> float:
        """Finish the GPU work a step leaves until its tokens are committed; -> the seconds spent.
        committed[i]: the tokens row i committed, None where its lane state is not retained. A
        speculative round brings each retained lane's state to exactly its committed tokens
        (`SpecDecoder.settle`); every other step has nothing left (0.0)."""
        if self.spec is None:
            return 0.0
        t0 = time.perf_counter()
        with torch.inference_mode():
            if not self.spec.settle(result, committed):
                return 0.0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def execute(self, plan: StepPlan, on_launch: Callable[[], None] | None = None) -> StepResult:
        """Run one plan to its result: `resolve(launch(plan))` (warm-up, benchmarks, tests)."""
        return self.resolve(self.launch(plan, on_launch=on_launch))

    def _begin(self) -> float:
        """A step starts: capture first if not done yet; -> its start time."""
        if not self._capture_ran:
            self.capture_graphs()
        self._steps += 1
        return time.perf_counter()

    def _launched(self) -> None:
        """Call the current launch's `on_launch`, once."""
        fn, self._on_launch = self._on_launch, None
        if fn is not None:
            fn()

    def _slot_ops(self, ops: list[SlotOp]) -> None:
        for op in ops:
            if op.src is None:
                self.states.zero_slot(op.dst)
            else:
                self.states.copy_slot(op.src, op.dst)
            if self.spec is not None:
                self.spec.slot_op(op)

    def _pack(
        self,
        tokens: list[list[int]],
        starts: Sequence[int],
        slots: Sequence[int],
        pages: Sequence[Sequence[int]],
        offsets: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """The batch as one flat int64 host buffer (pinned for a GPU)."""
        words = packed_len(len(tokens), len(tokens[0]), self.max_pages)
        return pack(host_buffer(words, self.device), tokens, starts, slots, pages, self.max_pages, offsets)

    def forward(self, rows: StepRows, feed: torch.Tensor | None = None) -> StepOut:
        """One target forward of B rows of q tokens: a graph replay when one was captured for
        (B, q) (q > 1 graphs carry per-token state writes), else eager. `feed` [B*q] int64 on the
        device replaces the rows' token ids (a decode round fed by the one before it)."""
        b, q = rows.shape
        writes = rows.writes is not None
        host = pack_rows(
            host_buffer(packed_len(b, q, self.max_pages, writes), self.device), rows, self.max_pages
        )
        if self.graphs is not None and self.graphs.has(b, q) and writes == (q > 1):
            out = self.graphs.run(host, b, q, feed)
            self._launched()  # the GPU runs the graph while the caller's host work goes on
            return out
        self._launched()
        flat = host.to(self.device, non_blocking=True)
        if feed is not None:
            flat[: b * q].copy_(feed.reshape(-1))
        batch = unpack(flat, b, q, self.max_pages, max_kv_len=max(rows.cache_lens) + q, writes=writes)
        hidden, logits = self._forward_logits(batch)
        return StepOut(hidden, logits)

    def _batch(
        self,
        tokens: list[list[int]],
        starts: list[int],
        slots: list[int],
        pages: list[list[int]],
        offsets: list[int] | None = None,
    ) -> ForwardBatch:
        """An eager batch: one host->device copy; attention may stop at the longest sequence."""
        host = self._pack(tokens, starts, slots, pages, offsets)
        flat = host.to(self.device, non_blocking=True)
        b, q = len(tokens), len(tokens[0])
        return unpack(flat, b, q, self.max_pages, max_kv_len=max(starts) + q)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, H] -> float32 logits [B, V] with the padded ids (>= vocab_limit) at -inf."""
        logits = self.model.logits(hidden)
        if self.vocab_limit is not None and self.vocab_limit < logits.shape[-1]:
            logits[..., self.vocab_limit :] = float("-inf")
        return logits

    def _forward_logits(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole step: model, final norm, lm_head, masking. -> hidden [B, q, H], float32 [B, q, V]"""
        hidden = self.model(batch, self.kv, self.states)  # [B, q, H]
        return hidden, self._logits(hidden)

    def _decode_logits(self, batch: ForwardBatch) -> torch.Tensor:
        """The decode step's float32 logits [B, V] alone (the benchmark profiler's entry point)."""
        return self._forward_logits(batch)[1][:, -1]

    def prefill_bucket(self, chunks: Sequence[tuple[int, int, int]]) -> int | None:
        """The bucket q of a captured (len(chunks), q) prefill graph that takes every chunk
        (tokens, start, pages held), its pages covering the padding; None when there is none."""
        if self.graphs is None or not chunks:
            return None
        b, n = len(chunks), max(t for t, _, _ in chunks)
        for q in self.prefill_buckets:
            if n <= q and self.graphs.has(b, q):  # a larger bucket needs more pages still
                return q if all(pages_for(start + q) <= pages for _, start, pages in chunks) else None
        return None

    def _bucket(self, plan: PrefillPlan) -> int | None:
        """The captured prefill graph a chunk fits (text only, its pages covering the padding)."""
        if plan.multimodal is not None or not plan.cuda_graph or plan.prompt_logprobs is not None:
            return None
        return self.prefill_bucket([(len(plan.tokens), plan.cached, len(plan.pages))])

    def _prefill_rows(self, plans: Sequence[PrefillPlan], q: int) -> StepResult:
        """Short chunks of B requests as one replay of the (B, q) graph: each padded with token 0
        after its chunk, its GDN state written only after its last real token (padding states are
        not stored); the padding's K/V lands past each sequence's frontier, where it is never read
        before a later token overwrites it. The rows whose chunk ends their prompt sample their
        first token together."""
        for plan in plans:
            self._slot_ops(plan.ops_before)
        lens = [len(p.tokens) for p in plans]
        rows = StepRows(
            [p.tokens + [0] * (q - n) for p, n in zip(plans, lens, strict=True)],
            [p.cached for p in plans],
            [p.slot for p in plans],
            [p.pages for p in plans],
            None,
            [[-1] * (n - 1) + [p.slot] + [-1] * (q - n) for p, n in zip(plans, lens, strict=True)],
        )
        out = self.forward(rows)  # hidden [B, q, H], logits [B, q, V]; the graph's launch delivers
        for i, (plan, n) in enumerate(zip(plans, lens, strict=True)):
            if self.spec is not None:
                rope = (
                    torch.arange(plan.cached, plan.cached + n, device=self.device).expand(3, n).contiguous()
                )
                self.spec.after_prefill(
                    plan.slot, plan.cached, plan.tokens, out.hidden[i, :n], rope, plan.pages
                )
            self._slot_ops(plan.ops_after)
        last = [i for i, p in enumerate(plans) if p.sampler is not None]
        if not last:
            return StepResult(seq_ids=[], runs=[])
        # [k, V] float32 (masked in the graph): views stacked, no index tensors copied to the device
        logits = torch.stack([out.logits[i, lens[i] - 1] for i in last])
        return _first_tokens([plans[i] for i in last], logits)

    def _prefill(self, plan: PrefillPlan) -> StepResult:
        q = self._bucket(plan)
        if q is not None:
            return self._prefill_rows([plan], q)
        self._launched()  # an eager forward: its kernel launches are host work, deliver first
        self._slot_ops(plan.ops_before)
        batch = self._batch([plan.tokens], [plan.cached], [plan.slot], [plan.pages])
        vision_s = 0.0
        if plan.multimodal is not None:
            if self.media is None:
                raise RuntimeError("a multimodal prompt reached an engine without a vision tower")
            batch.embeds, batch.positions, vision_s = self.media.chunk(
                self.model, plan.multimodal, batch.input_ids, plan.cached
            )
        hidden = self.model(batch, self.kv, self.states)  # [1, q, H]
        if self.spec is not None:
            rope = batch.positions[:, 0]  # [3, q] (multimodal prompts: the T/H/W streams)
            self.spec.after_prefill(plan.slot, plan.cached, plan.tokens, hidden[0], rope, plan.pages)
        self._slot_ops(plan.ops_after)
        scored = None
        if plan.prompt_logprobs is not None:
            scored = score_positions(self._logits, hidden[0], plan.targets, plan.prompt_logprobs)
        if plan.sampler is None:
            return StepResult(seq_ids=[], runs=[], vision_seconds=vision_s, prompt_logprobs=scored)
        result = _first_tokens([plan], self._logits(hidden[:, -1]))  # [1, V] float32
        result.vision_seconds = vision_s
        result.prompt_logprobs = scored
        return result


def _first_tokens(plans: Sequence[PrefillPlan], logits: torch.Tensor) -> StepResult:
    """Sample each prompt's first token from its last position's logits [k, V] (with its
    logprobs when the request asked for them)."""
    rows = [p.sampler for p in plans if p.sampler is not None]
    assert len(rows) == len(plans), "only a prompt's last chunk samples"
    tokens, lp = sample_with_logprobs(logits, rows)
    return StepResult.sampled([p.seq_id for p in plans], tokens, lp)


def prefill_graph_shapes(
    buckets: Sequence[int], config: TextConfig, max_rows: int
) -> tuple[tuple[int, int], ...]:
    """(rows, q) of the prefill graphs: every bucket for 1, 2, 4, ... and max_rows rows (each
    captured graph costs ready time: ~2 s for a full-size 27B step on the H200), as far as the
    graph-safe small-batch MoE kernels take them (at most 64 tokens and 384 routed rows a step)."""
    rows = sorted({1 << i for i in range(max_rows.bit_length()) if 1 << i <= max_rows} | {max_rows})
    return tuple((b, q) for q in buckets for b in rows if _graph_safe(b, q, config))


def _graph_safe(b: int, q: int, config: TextConfig) -> bool:
    """Whether a (b, q) step takes the graph-safe kernels: the conv step kernel (at most 64 tokens
    a row) and, on MoE models, the small-batch expert kernels (64 tokens, 384 routed rows a step)."""
    if q > SMALL_STEP_MAX_TOKENS:
        return False
    routed = b * q * int(config.num_experts_per_tok or 1)
    return not config.is_moe or (b * q <= SMALL_MOE_TOKENS and routed <= SMALL_MOE_ROWS)


def small_prefill_buckets(buckets: Sequence[int], config: TextConfig) -> tuple[int, ...]:
    """The prefill bucket sizes a model's captured one-row step supports (`_graph_safe`)."""
    return tuple(q for q in sorted(set(buckets)) if q >= 2 and _graph_safe(1, q, config))


def _capture_error(stats: GraphStats) -> str | None:
    """The first error a capture met: the step's graphs', the prefill rows', an added family's."""
    errors = [stats.error, stats.prefill_error, *(f.error for f in stats.families.values())]
    return next((e for e in errors if e is not None), None)


def _recompile_limit(max_batch: int) -> int:
    """Compiled variants each layer kind may keep: its decode, verify and prefill shapes."""
    return 8 * max_batch + 16


def _graph_breaks() -> int:
    """Graph breaks Dynamo recorded in this process (each splits the compiled step)."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())
