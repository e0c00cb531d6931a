"""Prefill warm-up before ready: every prefill shape class a request can produce runs once.

A prefill chunk's kernels are specialised by its length: up to 16 tokens the step runs the
decode kernels with the length unrolled at compile time, longer chunks run the chunked GDN rule
(fla, autotuned once per kernel) and an attention path chosen by length (< 64 tokens: paged
attention, else gathered-page SDPA), and Triton specialises every integer argument on `== 1` and
divisibility by 16. A length first seen after ready would compile then (seconds to a minute on
the GPU). So the engine thread runs, before it reports prepared: every length 1..80 from an empty
history, lengths around each power of two up to the chunk size, and chunks after a history (the
second chunk of a long prompt, unaligned and aligned). The set is checked on the GPU by the
serving benchmark, which counts compilations after ready (`ninfer.kernels.jit_watch`).

Warm-up writes one scratch lane (slot 0, the first pages); every admission zeroes or restores its
lane's slot before its first chunk and K/V beyond a sequence's frontier is never read, so no
request sees what warm-up left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ninfer.engine.pages import pages_for
from ninfer.engine.plan import PrefillPlan, SlotOp

SMALL_LIMIT = 80  # every length up to this runs (unrolled small steps, both attention paths' edges)


@dataclass(frozen=True)
class WarmupChunk:
    start: int  # tokens of history before the chunk
    length: int


@dataclass(frozen=True)
class WarmupReport:
    chunks: int
    seconds: float


def warmup_chunks(prefill_chunk: int, max_context: int) -> list[WarmupChunk]:
    """The prefill chunks that reach every length class, within `max_context`."""
    lengths = set(range(1, min(SMALL_LIMIT, prefill_chunk) + 1))
    p = 64
    while p <= prefill_chunk:
        lengths.update(n for n in (p - 1, p, p + 1) if n <= prefill_chunk)
        p *= 2
    lengths.add(prefill_chunk)
    chunks = [WarmupChunk(0, n) for n in sorted(lengths) if n <= max_context]
    # after a history: the second chunk of a long prompt (unaligned and page-aligned starts)
    for start in (prefill_chunk, 100):
        for n in (1, 17, 63, 64, 100, prefill_chunk):
            if start + n <= max_context:
                chunks.append(WarmupChunk(start, n))
    return chunks


def warm_prefill(
    execute: Callable[[PrefillPlan], object], chunks: list[WarmupChunk], vocab: int, slot: int = 0
) -> WarmupReport:
    """Run each chunk as a prefill of a scratch sequence in `slot` through `execute`
    (`Runner.execute`). A chunk after a history first fills that history in one chunk."""
    t0 = time.perf_counter()
    for i, c in enumerate(chunks):
        tokens = [(i * 7919 + j * 104729) % vocab for j in range(c.length)]
        pages = list(range(pages_for(c.start + c.length)))
        execute(PrefillPlan(seq_id=-1, tokens=tokens, start=c.start, slot=slot, pages=pages,
                            ops_before=[SlotOp(dst=slot)] if c.start == 0 else []))  # fmt: skip
    return WarmupReport(chunks=len(chunks), seconds=time.perf_counter() - t0)
