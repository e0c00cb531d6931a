"""The one manager of the engine's CUDA graphs (`StepGraphs`): the capture backend, the one memory
pool, the capture order and one `GraphStats` for every captured shape. The step's own shapes are
decode (B, q = 1), speculative verification (B, q = k + 1) and prefill rows (B, bucket q), each over
one-copy static inputs; other components add their graphs as a family (`StepGraphs.add_family`:
the MTP drafter's greedy proposal per batch size, `speculative/draft_graphs.py`), captured into
the same pool after the step's shapes and replayed through the manager."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch

from ninfer.engine.step_io import StepOut, host_buffer, pack, packed_len, unpack
from ninfer.kernels.launch_scope import for_step, pdl_allowed
from ninfer.model.cache import ForwardBatch

log = logging.getLogger("ninfer.engine.graphs")

# batch -> (hidden [B, q, H], float32 logits [B, q, V] with the padded ids masked)
StepFn = Callable[[ForwardBatch], tuple[torch.Tensor, torch.Tensor]]
# installs (a callable) or removes (None) the cut that a captured step calls between its segments
InstallCut = Callable[[Callable[[], None] | None], None]


# ----------------------------------------------------------------------------- capture backends
class CaptureBackend(Protocol):
    """How a step is captured and replayed (CUDA graphs on a GPU; a plain call in tests).

    `install_cut`, when given, receives a callable before the capture and None after it; the
    step calls it between its segments (e.g. every few decoder layers), and each segment becomes
    its own graph, replayed in order. Launching a graph costs the host time per node (about 1-2
    µs; a 35B-A3B decode step has ~770 kernels): as one graph the GPU idles until most of that
    launch is done, in segments it starts on the first while the host launches the rest."""

    def new_pool(self) -> object: ...

    def capture(
        self, fn: Callable[[], None], pool: object, install_cut: InstallCut | None = None
    ) -> Callable[[], None]: ...

    def memory_reserved(self) -> int: ...


def call_with_cut(fn: Callable[[], None], install_cut: InstallCut | None, cut: Callable[[], None]) -> None:
    """fn() with `cut` installed (when the step takes one), removed afterwards even on error."""
    if install_cut is not None:
        install_cut(cut)
    try:
        fn()
    finally:
        if install_cut is not None:
            install_cut(None)


class CudaCapture:
    """`torch.cuda.CUDAGraph` capture on a side stream after warm-up calls (Triton JIT and
    autotuning, torch.compile), the last of which must not synchronize with the host."""

    def __init__(self, device: torch.device, warmup: int = 2) -> None:
        self.device = device
        self.warmup = max(1, warmup)

    def new_pool(self) -> object:
        return torch.cuda.graph_pool_handle()

    def capture(
        self, fn: Callable[[], None], pool: object, install_cut: InstallCut | None = None
    ) -> Callable[[], None]:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for i in range(self.warmup):
                if i < self.warmup - 1:
                    fn()
                    continue
                torch.cuda.set_sync_debug_mode("error")  # a host sync cannot be captured
                try:
                    fn()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
        torch.cuda.current_stream(self.device).wait_stream(side)
        # what torch.cuda.graph does around one capture, for a chain of them on one stream
        torch.cuda.synchronize(self.device)
        gc.collect()
        torch.cuda.empty_cache()
        graphs = [torch.cuda.CUDAGraph()]

        def cut() -> None:  # end this segment's graph, begin the next on the same stream
            graphs[-1].capture_end()
            graphs.append(torch.cuda.CUDAGraph())
            graphs[-1].capture_begin(pool=pool, capture_error_mode="thread_local")

        with torch.cuda.stream(torch.cuda.Stream(self.device)):
            graphs[0].capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                call_with_cut(fn, install_cut, cut)
            finally:
                graphs[-1].capture_end()
        if len(graphs) == 1:
            return graphs[0].replay

        def replay() -> None:
            for g in graphs:
                g.replay()

        return replay

    def memory_reserved(self) -> int:
        """Reserved bytes with the free cached blocks released (graph capture releases them too,
        so a before/after difference is the memory the graphs and their buffers hold)."""
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved(self.device)


def default_capture(device: torch.device) -> CaptureBackend | None:
    """The capture backend of a device: CUDA graphs on a GPU, none elsewhere."""
    return CudaCapture(device) if device.type == "cuda" else None


class EagerCapture:
    """Replays by calling the step again: the graph manager's bookkeeping without a GPU."""

    def __init__(self) -> None:
        self.captured: list[tuple[int, int]] = []  # (batch size, q), in capture order
        self.segments: list[int] = []  # segments of each capture (cuts + 1), in capture order

    def new_pool(self) -> object:
        return None

    def capture(
        self, fn: Callable[[], None], pool: object, install_cut: InstallCut | None = None
    ) -> Callable[[], None]:
        cuts = [0]

        def cut() -> None:
            cuts[0] += 1

        call_with_cut(fn, install_cut, cut)
        self.segments.append(cuts[0] + 1)
        return fn

    def memory_reserved(self) -> int:
        return 0


# ----------------------------------------------------------------------------- the manager
@dataclass
class FamilyStats:
    """What one added family's capture cost (e.g. the MTP drafter's proposal, per batch size);
    `error` says why its graphs are off (the step's graphs unaffected)."""

    batch_sizes: tuple[int, ...]
    capture_s: float = 0.0
    pool_bytes: int = 0
    error: str | None = None


@dataclass
class GraphStats:
    """What capture cost; `error` says why graphs are off when capture failed. The decode graphs
    (q = 1) are `batch_sizes`; with speculation the verify graphs (q = k + 1, per-token GDN state
    writes) are `verify_batch_sizes`, captured first into the same pool; the added families
    (`families`, e.g. "draft": the MTP proposal graphs) last, into the same pool."""

    batch_sizes: tuple[int, ...]
    capture_s: float
    pool_bytes: int  # device memory reserved by capture: static inputs and outputs, graph pool
    error: str | None = None
    verify_q: int | None = None
    verify_batch_sizes: tuple[int, ...] = ()
    verify_capture_s: float = 0.0
    verify_pool_bytes: int = 0
    prefill_buckets: tuple[int, ...] = ()  # one-row prefill graphs of q tokens (see StepGraphs)
    prefill_shapes: tuple[tuple[int, int], ...] = ()  # every captured prefill (rows, q)
    prefill_capture_s: float = 0.0
    prefill_error: str | None = None  # why the prefill graphs are off (decode graphs unaffected)
    graph_breaks: int | None = None  # with torch.compile: Dynamo's graph breaks in the captured steps
    compile_error: str | None = None  # why torch.compile was dropped at startup (the eager step runs)
    families: dict[str, FamilyStats] = field(default_factory=dict)  # added families by name

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class _Family:
    """Graphs another component added (`StepGraphs.add_family`)."""

    sizes: tuple[int, ...]  # batch sizes, largest first (the capture order)
    build: Callable[[int], Callable[[], None]]  # batch size -> the step to capture (static inputs set up)
    install_cut: InstallCut | None
    q: int  # tokens per row of the family's steps (the launch scope's shape)
    replay: dict[int, Callable[[], None]] = field(default_factory=dict)


def _no_step(batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
    raise RuntimeError("a manager of added families only has no step of its own")


class StepGraphs:
    """One captured step per (B, q): q = 1 decode for B = 1..max_batch and, with `verify_q`, the
    speculative verification of q = k + 1 tokens whose GDN state after each token goes to the
    packed `write_slots`. All share one memory pool; inputs are one packed int64 buffer per key,
    filled by one copy; outputs (hidden, float32 logits, in-graph argmax) land in static buffers
    per q, so an all-greedy batch reads only B*q ints back.

    `prefill_shapes`: (rows, q) graphs with per-token state writes (the verify form), for short
    prompt chunks of one or several requests, each padded to the bucket q: the state is written
    only after each row's last real token, so short prefills arriving together are one
    weight-bound replay instead of one eager, launch-bound forward each. Their capture failing
    leaves them off and the decode graphs as they are.

    `add_family`: graphs of another component (the MTP drafter's proposal), built per batch size
    by it and captured, replayed and accounted here, after the step's own shapes."""

    def __init__(
        self,
        step: StepFn,
        max_batch: int,
        max_pages: int,
        vocab: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        backend: CaptureBackend,
        verify_q: int | None = None,
        install_cut: InstallCut | None = None,
        prefill_shapes: Iterable[tuple[int, int]] = (),
    ) -> None:
        if verify_q is not None and verify_q < 2:
            raise ValueError(f"verify_q must be at least 2, got {verify_q}")
        self.prefill_shapes = tuple(
            sorted({(b, q) for b, q in prefill_shapes if q >= 2 and 1 <= b <= max_batch})
        )
        self.step, self.max_batch, self.max_pages = step, max_batch, max_pages
        self.vocab, self.hidden_size, self.dtype = vocab, hidden_size, dtype
        self.device, self.backend = device, backend
        self.verify_q = verify_q
        self.install_cut = install_cut  # segments the captured step (see CaptureBackend)
        self.static: dict[tuple[int, int], torch.Tensor] = {}  # (B, q) -> device [packed_len]
        self.outputs: dict[int, StepOut] = {}  # q -> [Bmax, q, ...] static outputs
        self._replay: dict[tuple[int, int], Callable[[], None]] = {}
        self._families: dict[str, _Family] = {}
        self.family_stats: dict[str, FamilyStats] = {}  # by name, once captured (also in GraphStats)
        self.pool: object | None = None

    @classmethod
    def families_only(cls, backend: CaptureBackend, device: torch.device) -> StepGraphs:
        """A manager without step shapes, for added families alone (a drafter benchmarked alone)."""
        return cls(_no_step, 0, 0, 0, 0, torch.float32, device, backend)

    def has(self, b: int, q: int = 1) -> bool:
        return (b, q) in self._replay

    def add_family(
        self,
        name: str,
        sizes: Iterable[int],
        build: Callable[[int], Callable[[], None]],
        install_cut: InstallCut | None = None,
        q: int = 1,
    ) -> None:
        """Capture `build(b)` for every batch size in `sizes` with this manager's graphs (after the
        step's own shapes, largest first, in the same pool); `install_cut` segments each capture
        (see CaptureBackend), `q` is the family's tokens per row. A family's failed capture leaves
        it off alone (`GraphStats.families[name].error`)."""
        if name in self._families:
            raise ValueError(f"graph family {name!r} added twice")
        self._families[name] = _Family(tuple(sorted(set(sizes), reverse=True)), build, install_cut, q)

    def has_family(self, name: str, b: int | None = None) -> bool:
        """Whether the family's batch-b graph (any of its graphs: `b` None) was captured."""
        family = self._families.get(name)
        return family is not None and (bool(family.replay) if b is None else b in family.replay)

    def replay_family(self, name: str, b: int) -> None:
        """Replay the family's batch-b graph on the inputs its step last received."""
        self._families[name].replay[b]()

    def capture(self, sizes: Iterable[int] | None = None, pool: object | None = None) -> GraphStats:
        """Capture every size for the verify q (when set), then for q = 1, largest first so smaller
        graphs reuse the pool, then the prefill shapes, then every added family: one pool for all
        (`pool`: default a new one, kept in `self.pool`). Warm-up runs write scratch KV into page
        0 and GDN state into slots 0..B-1: call before any sequence exists."""
        order = sorted(set(range(1, self.max_batch + 1) if sizes is None else sizes), reverse=True)
        if order and not 1 <= order[-1] <= order[0] <= self.max_batch:
            raise ValueError(f"batch sizes must lie in 1..{self.max_batch}, got {order}")
        self.pool = pool = self.backend.new_pool() if pool is None else pool
        groups = ([self.verify_q] if self.verify_q is not None else []) + [1]
        done: dict[int, tuple[float, int]] = {}
        t_all = time.perf_counter()
        try:
            for q in groups:
                t0 = time.perf_counter()
                mem0 = self.backend.memory_reserved()
                self.outputs[q] = self._output_buffers(q)
                for b in order:
                    self._capture_one(b, q, pool)
                done[q] = (time.perf_counter() - t0, self.backend.memory_reserved() - mem0)
        except Exception as exc:  # e.g. an op that synchronizes: decode runs eagerly instead
            self.static.clear()
            self._replay.clear()
            self.outputs.clear()
            err = _error_line(exc)
            log.warning("CUDA graphs disabled, decode runs eagerly: %s", err)
            failed = GraphStats((), time.perf_counter() - t_all, 0, err, self.verify_q)
            self._capture_families(pool, failed)
            return failed
        sizes_t = tuple(sorted(order))
        stats = GraphStats(sizes_t, *done[1])
        self._capture_prefill(pool, stats)
        if self.verify_q is not None:
            vs, vb = done[self.verify_q]
            stats.verify_q, stats.verify_batch_sizes = self.verify_q, sizes_t
            stats.verify_capture_s, stats.verify_pool_bytes = vs, vb
        if self.max_batch:
            self._log(stats)
        self._capture_families(pool, stats)
        return stats

    def _log(self, stats: GraphStats) -> None:
        log.info(
            "captured %d decode graphs (batch 1..%d) in %.2f s, %.1f MiB; verify q=%s: %.2f s, %.1f MiB; "
            "%d prefill graphs (buckets %s, up to %d rows) in %.2f s",
            len(stats.batch_sizes),
            self.max_batch,
            stats.capture_s,
            stats.pool_bytes / 2**20,
            self.verify_q,
            stats.verify_capture_s,
            stats.verify_pool_bytes / 2**20,
            len(stats.prefill_shapes),
            "/".join(str(q) for q in sorted({q for _, q in stats.prefill_shapes})) or "none",
            max((b for b, _ in stats.prefill_shapes), default=0),
            stats.prefill_capture_s,
        )

    def _capture_families(self, pool: object, stats: GraphStats) -> None:
        """Every added family's sizes (largest first) into `pool`; a failure drops its family alone."""
        for name, family in self._families.items():
            t0 = time.perf_counter()
            mem0 = self.backend.memory_reserved()
            try:
                for b in family.sizes:
                    if b not in family.replay:
                        family.replay[b] = self._capture(
                            family.build(b), pool, b, family.q, family.install_cut
                        )
            except Exception as exc:  # e.g. an op that synchronizes: the family runs eagerly instead
                family.replay.clear()
                err = _error_line(exc)
                log.warning("%s graphs disabled, they run eagerly: %s", name, err)
                stats.families[name] = self.family_stats[name] = FamilyStats(
                    (), time.perf_counter() - t0, 0, err
                )
                continue
            fs = FamilyStats(
                tuple(sorted(family.sizes)), time.perf_counter() - t0, self.backend.memory_reserved() - mem0
            )
            stats.families[name] = self.family_stats[name] = fs
            log.info(
                "captured %d %s graphs (batch %s) in %.2f s, %.1f MiB",
                len(fs.batch_sizes), name, ",".join(map(str, fs.batch_sizes)), fs.capture_s,
                fs.pool_bytes / 2**20,
            )  # fmt: skip

    def _capture_prefill(self, pool: object, stats: GraphStats) -> None:
        """The one-row prefill shapes, then those of several rows, each group largest first (one
        output buffer per q, as many rows as its widest shape); a failure drops its group alone
        (several rows failing leaves the one-row graphs)."""
        t0 = time.perf_counter()
        todo = [s for s in self.prefill_shapes if not self.has(*s)]
        for q in {q for _, q in todo}:
            rows = max(r for r, qq in self.prefill_shapes if qq == q)
            self.outputs.setdefault(q, self._output_buffers(q, rows=rows))
        for group in ([s for s in todo if s[0] == 1], [s for s in todo if s[0] > 1]):
            shapes = sorted(group, key=lambda s: (s[0] * s[1], s), reverse=True)
            try:
                for b, q in shapes:
                    self._capture_one(b, q, pool)
            except Exception as exc:
                for s in shapes:
                    self._replay.pop(s, None)
                    self.static.pop(s, None)
                stats.prefill_error = _error_line(exc)
                log.warning("prefill graphs of %s rows disabled: %s", "one" if shapes[0][0] == 1 else "several",
                            stats.prefill_error)  # fmt: skip
                break
        stats.prefill_shapes = tuple(s for s in self.prefill_shapes if self.has(*s))
        stats.prefill_buckets = tuple(sorted({q for b, q in stats.prefill_shapes if b == 1}))
        stats.prefill_capture_s = time.perf_counter() - t0

    def _output_buffers(self, q: int, rows: int | None = None) -> StepOut:
        bmax, dev = rows or self.max_batch, self.device
        return StepOut(
            hidden=torch.zeros(bmax, q, self.hidden_size, dtype=self.dtype, device=dev),  # [Bmax, q, H]
            logits=torch.zeros(bmax, q, self.vocab, dtype=torch.float32, device=dev),  # [Bmax, q, V]
            argmax=torch.zeros(bmax, q, dtype=torch.int64, device=dev),  # [Bmax, q]
        )

    def _capture_one(self, b: int, q: int, pool: object) -> None:
        writes = q > 1
        flat = torch.zeros(packed_len(b, q, self.max_pages, writes), dtype=torch.int64, device=self.device)
        scratch = pack(
            host_buffer(flat.numel(), torch.device("cpu")),
            [[0] * q] * b,
            [0] * b,
            list(range(b)),
            [[0]] * b,
            self.max_pages,
            writes=[[i] * q for i in range(b)] if writes else None,
        )
        flat.copy_(scratch)
        batch = unpack(flat, b, q, self.max_pages, writes=writes)  # max_kv_len None: full static width
        out = self.outputs[q]
        hidden, logits, argmax = out.hidden[:b], out.logits[:b], out.argmax[:b]  # type: ignore[index]

        def fn() -> None:
            h, lg = self.step(batch)  # [b, q, H], [b, q, V]
            hidden.copy_(h)
            logits.copy_(lg)
            argmax.copy_(lg.argmax(-1))

        self._replay[(b, q)] = self._capture(fn, pool, b, q, self.install_cut)
        self.static[(b, q)] = flat

    def _capture(
        self, fn: Callable[[], None], pool: object, b: int, q: int, install_cut: InstallCut | None
    ) -> Callable[[], None]:
        """One graph of a (b, q)-shaped step into `pool` -> its replay."""
        with pdl_allowed(for_step(b, q)):
            replay = self.backend.capture(fn, pool, install_cut)
        if isinstance(self.backend, EagerCapture):
            self.backend.captured.append((b, q))
        return replay

    def replay(self, b: int, q: int = 1) -> None:
        """Replay the (b, q) graph on the inputs it last received (timing; no host work)."""
        self._replay[(b, q)]()

    def run(self, packed: torch.Tensor, b: int, q: int = 1, feed: torch.Tensor | None = None) -> StepOut:
        """packed: host [packed_len(b, q, max_pages, q > 1)] -> views [:b] of the static outputs of
        this q (valid until the next replay with the same q). `feed`: [b*q] int64 on the device,
        the token ids to use instead of the packed ones."""
        static = self.static[(b, q)]
        static.copy_(packed, non_blocking=True)
        if feed is not None:
            static[: b * q].copy_(feed.reshape(-1))
        self.replay(b, q)
        out = self.outputs[q]
        return StepOut(out.hidden[:b], out.logits[:b], out.argmax[:b])  # type: ignore[index]


def _error_line(exc: Exception) -> str:
    """A failed capture's reason in one short line."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
