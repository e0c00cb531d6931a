"""CUDA graphs of the whole decode step, one per exact batch size, over one-copy static inputs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

import torch

from ninfer.model.cache import ForwardBatch

log = logging.getLogger("ninfer.engine.graphs")

StepFn = Callable[[ForwardBatch], torch.Tensor]  # batch -> float32 logits [B, V], padded ids masked


# ----------------------------------------------------------------------------- packed batches
def packed_len(b: int, q: int, max_pages: int) -> int:
    """int64 words of one packed batch: ids B*q | positions 3*B*q | slots B | cache_lens B |
    page table B*max_pages int32 (two per word, the last word half used when B*max_pages is odd)."""
    return 4 * b * q + 2 * b + -(-b * max_pages // 2)


def pack(
    out: torch.Tensor,
    tokens: Sequence[Sequence[int]],
    starts: Sequence[int],
    slots: Sequence[int],
    pages: Sequence[Sequence[int]],
    max_pages: int,
    offsets: Sequence[int] | None = None,
) -> torch.Tensor:
    """Write a batch of B rows of q tokens into the flat int64 host buffer `out` [packed_len];
    page-table rows are right-padded with -1. `offsets` (per row, e.g. a multimodal rope_delta) are
    added to the positions. Returns `out`."""
    b, q = len(tokens), len(tokens[0])
    n = b * q
    out[:n] = torch.tensor(tokens, dtype=torch.int64).view(-1)
    lens = torch.tensor(starts, dtype=torch.int64)  # [B]
    first = lens if offsets is None else lens + torch.tensor(offsets, dtype=torch.int64)
    out[n : 4 * n].view(3, b, q)[:] = first[:, None] + torch.arange(q)  # [3, B, q], equal streams
    out[4 * n : 4 * n + b] = torch.tensor(slots, dtype=torch.int64)
    out[4 * n + b : 4 * n + 2 * b] = lens
    table = out[4 * n + 2 * b :].view(torch.int32)[: b * max_pages].view(b, max_pages)
    table.fill_(-1)
    for i, p in enumerate(pages):
        if len(p) > max_pages:
            raise ValueError(f"row {i} has {len(p)} pages, more than max_pages={max_pages}")
        table[i, : len(p)] = torch.tensor(p, dtype=torch.int32)
    return out


def unpack(flat: torch.Tensor, b: int, q: int, max_pages: int, max_kv_len: int | None = None) -> ForwardBatch:
    """Views of a packed batch (host or device) as a `ForwardBatch`; no copy."""
    n = b * q
    return ForwardBatch(
        input_ids=flat[:n].view(b, q),  # [B, q]
        positions=flat[n : 4 * n].view(3, b, q),  # [3, B, q]
        slots=flat[4 * n : 4 * n + b],  # [B]
        page_table=flat[4 * n + 2 * b :].view(torch.int32)[: b * max_pages].view(b, max_pages),
        cache_lens=flat[4 * n + b : 4 * n + 2 * b],  # [B]
        max_kv_len=max_kv_len,
    )


def host_buffer(words: int, device: torch.device) -> torch.Tensor:
    """A fresh flat int64 staging buffer, pinned when it is bound for a GPU (the caching host
    allocator keeps it until the copy that reads it has run, so reuse is safe)."""
    return torch.empty(words, dtype=torch.int64, pin_memory=device.type == "cuda")


# ----------------------------------------------------------------------------- capture backends
class CaptureBackend(Protocol):
    """How a step is captured and replayed (CUDA graphs on a GPU; a plain call in tests)."""

    def new_pool(self) -> object: ...

    def capture(self, fn: Callable[[], None], pool: object) -> Callable[[], None]: ...

    def memory_reserved(self) -> int: ...


class CudaCapture:
    """`torch.cuda.CUDAGraph` capture on a side stream after warm-up calls (Triton JIT and
    autotuning, torch.compile), the last of which must not synchronize with the host."""

    def __init__(self, device: torch.device, warmup: int = 2) -> None:
        self.device = device
        self.warmup = max(1, warmup)

    def new_pool(self) -> object:
        return torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], None], pool: object) -> Callable[[], None]:
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
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            fn()
        return graph.replay

    def memory_reserved(self) -> int:
        """Reserved bytes with the free cached blocks released (graph capture releases them too,
        so a before/after difference is the memory the graphs and their buffers hold)."""
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved(self.device)


class EagerCapture:
    """Replays by calling the step again: the graph manager's bookkeeping without a GPU."""

    def __init__(self) -> None:
        self.captured: list[int] = []  # batch sizes, in capture order

    def new_pool(self) -> object:
        return None

    def capture(self, fn: Callable[[], None], pool: object) -> Callable[[], None]:
        fn()
        return fn

    def memory_reserved(self) -> int:
        return 0


# ----------------------------------------------------------------------------- the manager
@dataclass
class GraphStats:
    """What capture cost; `error` says why graphs are off when capture failed."""

    batch_sizes: tuple[int, ...]
    capture_s: float
    pool_bytes: int  # device memory reserved by capture: static inputs, logits, graph pool
    error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class DecodeGraphs:
    """One captured decode step (B rows, q = 1) per exact batch size, sharing one memory pool and
    one static logits buffer. Inputs are one packed int64 buffer per size, filled by one copy."""

    def __init__(
        self,
        step: StepFn,
        max_batch: int,
        max_pages: int,
        vocab: int,
        device: torch.device,
        backend: CaptureBackend,
    ) -> None:
        self.step, self.max_batch, self.max_pages = step, max_batch, max_pages
        self.device, self.backend = device, backend
        self.logits = torch.zeros(max_batch, vocab, dtype=torch.float32, device=device)  # [Bmax, V]
        self.static: dict[int, torch.Tensor] = {}  # B -> device [packed_len(B, 1, max_pages)]
        self._replay: dict[int, Callable[[], None]] = {}

    def has(self, b: int) -> bool:
        return b in self._replay

    def capture(self, sizes: Iterable[int] | None = None) -> GraphStats:
        """Capture every size (largest first, so smaller ones reuse the pool). Warm-up runs write
        scratch KV into page 0 and GDN state into slots 0..B-1: call before any sequence exists."""
        order = sorted(set(range(1, self.max_batch + 1) if sizes is None else sizes), reverse=True)
        if order and not 1 <= order[-1] <= order[0] <= self.max_batch:
            raise ValueError(f"batch sizes must lie in 1..{self.max_batch}, got {order}")
        t0 = time.perf_counter()
        mem0 = self.backend.memory_reserved()
        pool = self.backend.new_pool()
        try:
            for b in order:
                self._capture_one(b, pool)
        except Exception as exc:  # e.g. an op that synchronizes: decode runs eagerly instead
            self.static.clear()
            self._replay.clear()
            err = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            log.warning("CUDA graphs disabled, decode runs eagerly: %s", err)
            return GraphStats((), time.perf_counter() - t0, 0, err)
        stats = GraphStats(
            tuple(sorted(order)), time.perf_counter() - t0, self.backend.memory_reserved() - mem0
        )
        log.info(
            "captured %d decode graphs (batch 1..%d) in %.2f s, %.1f MiB",
            len(order),
            self.max_batch,
            stats.capture_s,
            stats.pool_bytes / 2**20,
        )
        return stats

    def _capture_one(self, b: int, pool: object) -> None:
        flat = torch.zeros(packed_len(b, 1, self.max_pages), dtype=torch.int64, device=self.device)
        scratch = pack(
            host_buffer(flat.numel(), torch.device("cpu")),
            [[0]] * b,
            [0] * b,
            list(range(b)),
            [[0]] * b,
            self.max_pages,
        )
        flat.copy_(scratch)
        batch = unpack(flat, b, 1, self.max_pages)  # max_kv_len None: the full static width
        out = self.logits[:b]

        def fn() -> None:
            out.copy_(self.step(batch))

        self._replay[b] = self.backend.capture(fn, pool)
        self.static[b] = flat
        if isinstance(self.backend, EagerCapture):
            self.backend.captured.append(b)

    def run(self, packed: torch.Tensor, b: int) -> torch.Tensor:
        """packed: host [packed_len(b, 1, max_pages)] -> float32 logits [b, V] (a view of the
        static buffer, valid until the next replay)."""
        self.static[b].copy_(packed, non_blocking=True)
        self._replay[b]()
        return self.logits[:b]
