"""Prefill warm-up before ready: every prefill shape class a request can produce runs once.

A prefill chunk's kernels are specialised by its length: up to 16 tokens the step runs the
decode kernels with the length unrolled at compile time, longer chunks run the chunked GDN rule
(fla, autotuned once per kernel) and an attention path chosen by length (< 64 tokens: paged
attention, else gathered-page SDPA), and Triton specialises every integer argument on `== 1` and
divisibility by 16. A length first seen after ready would compile then (seconds to a minute on
the GPU). So the engine thread runs, before it reports ready: every length 1..80 from an empty
history, lengths around each power of two up to the chunk size, and chunks after a history (the
second chunk of a long prompt, unaligned and aligned). The set is checked on the GPU by the
serving benchmark, which counts compilations after ready (`ninfer.kernels.jit_watch`).

Short chunks usually replay a captured prefill bucket, but one whose lane's pages do not cover the
bucket's padding (a prompt's last chunk when few output tokens are allowed) runs eagerly, so every
warm-up chunk runs the eager forward (the buckets were captured, and compiled, before). Then the
sampling paths run once on random logits at batch 1 and the largest batch: greedy, temperature
with top-k / top-p / min-p, penalties, logprobs and a grammar mask, so the first request of each
kind loads no kernel either.

The chunks run through one decoder layer of each kind (`Qwen35Model.one_layer_per_kind`): every
layer of a kind runs the same kernels at the same shapes, so this reaches every kernel a full
forward does in a fraction of the time (on the H200 the full-depth warm-up took 51 s on the 27B
and 67 s on the 35B-A3B; ready time is what a restart costs). A model whose drafter reads captured
layer outputs (DFlash) warms up at full depth.

Warm-up writes one scratch lane (slot 0, the first pages); every admission zeroes or restores its
lane's slot before its first chunk and K/V beyond a sequence's frontier is never read, so no
request sees what warm-up left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ninfer.engine.config import MAX_LOGPROBS
from ninfer.engine.pages import pages_for
from ninfer.engine.plan import PrefillPlan, SlotOp
from ninfer.engine.sampler import ResolvedSampling, RowSampler, check_drawn, sample_rows_full

SMALL_LIMIT = 80  # every length up to this runs (unrolled small steps, both attention paths' edges)


@dataclass(frozen=True)
class WarmupChunk:
    start: int  # tokens of history before the chunk
    length: int


@dataclass(frozen=True)
class WarmupReport:
    chunks: int
    seconds: float
    thin: bool = False  # ran one decoder layer of each kind (`Qwen35Model.one_layer_per_kind`)


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
    execute: Callable[[PrefillPlan], object],
    chunks: list[WarmupChunk],
    vocab: int,
    slot: int = 0,
    thin: bool = False,
) -> WarmupReport:
    """Run each chunk as a prefill of a scratch sequence in `slot` through `execute`
    (`Runner.execute`). A chunk after a history first fills that history in one chunk."""
    t0 = time.perf_counter()
    for i, c in enumerate(chunks):
        tokens = [(i * 7919 + j * 104729) % vocab for j in range(c.length)]
        pages = list(range(pages_for(c.start + c.length)))
        execute(PrefillPlan(seq_id=-1, tokens=tokens, cached=c.start, slot=slot, pages=pages,
                            ops_before=[SlotOp(dst=slot)] if c.start == 0 else [], cuda_graph=False))  # fmt: skip
    return WarmupReport(chunks=len(chunks), seconds=time.perf_counter() - t0, thin=thin)


class _EvenTokens:
    """A constraint that allows the even token ids: the grammar-mask path without a grammar."""

    def fill(self, words: torch.Tensor) -> bool:
        words.fill_(0x55555555)  # bits 0, 2, 4, ... of every word
        return True

    def accept(self, token: int) -> None:
        pass


def warmup_samplers(device: torch.device) -> list[RowSampler]:
    """One row sampler of every sampling path `sample_rows_full` takes."""
    greedy = ResolvedSampling(0.0, 1.0, 0, 0.0, 0.0, 0.0, seed=0)
    top = ResolvedSampling(0.7, 0.8, 20, 0.0, 0.0, 0.0, seed=1)
    samplers = [
        RowSampler(greedy, device),
        RowSampler(top, device),
        RowSampler(ResolvedSampling(1.0, 1.0, 0, 0.05, 0.0, 0.0, seed=2), device),
        RowSampler(ResolvedSampling(0.6, 0.95, 20, 0.0, 1.5, 0.5, seed=3), device),  # penalties
        RowSampler(greedy, device, logprobs=MAX_LOGPROBS),  # the widest top-k
        RowSampler(top, device, logprobs=5, constraint=_EvenTokens()),
    ]
    for s in samplers:
        s.observe(2)  # penalties apply to tokens generated so far
    return samplers


def warm_sampling(device: torch.device, vocab: int, max_batch: int) -> int:
    """Sample random logits [B, vocab] with every sampler kind, B = 1 and `max_batch` (the kinds
    cycled over the rows), read back as the engine does. Returns the tokens drawn."""
    kinds = warmup_samplers(device)
    gen = torch.Generator(device=device).manual_seed(0)
    drawn = 0
    for b in sorted({1, max_batch}):
        for first in range(len(kinds) if b == 1 else 1):
            rows = [kinds[(first + i) % len(kinds)] for i in range(b)]
            logits = torch.randn(b, vocab, generator=gen, device=device)  # [B, V] float32
            for argmax in (None, torch.argmax(logits, dim=-1)):  # plain and in-graph argmax rounds
                toks, bad, lp = sample_rows_full(logits, rows, argmax)
                tokens = toks.tolist() if bad is None else check_drawn(torch.cat([toks, bad]).tolist())
                if lp is not None:
                    lp.read(tokens, rows, b)
                drawn += len(tokens)
    return drawn
