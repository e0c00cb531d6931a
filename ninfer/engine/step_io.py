"""One forward's input and output as plain data: `StepRows` packed into one int64 buffer (one
host->device copy), unpacked into a `ForwardBatch` by views; `StepOut` with the hidden rows,
logits and greedy choice. It imports nothing else of the engine (the graphs, the runner and the
speculative decoder all build on it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from ninfer.model.cache import ForwardBatch


class RowAt(Protocol):
    """Where a decode row feeds from (what `StepRows.for_decode` reads of a `plan.DecodeRow`)."""

    @property
    def cached(self) -> int: ...  # tokens already cached
    @property
    def slot(self) -> int: ...  # the live GDN slot
    @property
    def pages(self) -> list[int]: ...
    @property
    def rope_delta(self) -> int: ...  # a multimodal prompt's offset on all three position streams


@dataclass
class StepRows:
    """The input of one forward as plain lists: B rows of q tokens each."""

    tokens: list[list[int]]  # [B][q]
    cache_lens: list[int]  # [B] tokens already cached (the first position of each row)
    slots: list[int]  # [B] GDN slot read (and, without `writes`, overwritten)
    pages: list[list[int]]  # [B][<= max_pages] KV pages of each row
    offsets: list[int] | None = None  # [B] added to the positions (a multimodal rope_delta)
    writes: list[list[int]] | None = None  # [B][q] slot receiving the GDN state after token t

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.tokens), len(self.tokens[0])

    @classmethod
    def for_decode(
        cls, rows: Sequence[RowAt], inputs: list[list[int]], writes: list[list[int]] | None = None
    ) -> StepRows:
        """Decode rows fed `inputs` [B][q] from their positions into their live slots (offsets
        only when some row carries a multimodal rope_delta)."""
        offsets = [r.rope_delta for r in rows] if any(r.rope_delta for r in rows) else None
        return cls(inputs, [r.cached for r in rows], [r.slot for r in rows], [r.pages for r in rows],
                   offsets, writes)  # fmt: skip


def packed_len(b: int, q: int, max_pages: int, writes: bool = False) -> int:
    """int64 words of one packed batch: ids B*q | positions 3*B*q | slots B | cache_lens B |
    [write slots B*q] | page table B*max_pages int32 (two per word, the last word half used when
    B*max_pages is odd)."""
    return 4 * b * q + 2 * b + (b * q if writes else 0) + -(-b * max_pages // 2)


def pack(
    out: torch.Tensor,
    tokens: Sequence[Sequence[int]],
    starts: Sequence[int],
    slots: Sequence[int],
    pages: Sequence[Sequence[int]],
    max_pages: int,
    offsets: Sequence[int] | None = None,
    writes: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """Write a batch of B rows of q tokens into the flat int64 host buffer `out` [packed_len];
    page-table rows are right-padded with -1. `offsets` (per row, e.g. a multimodal rope_delta) are
    added to the positions; `writes` ([B][q] slots, see `ForwardBatch.write_slots`) are packed
    before the page table. Returns `out`."""
    b, q = len(tokens), len(tokens[0])
    n = b * q
    a = out.numpy()  # a view: numpy writes cost ~1 us where torch ops on small CPU tensors cost ~5
    a[:n] = np.asarray(tokens, dtype=np.int64).reshape(-1)
    lens = np.asarray(starts, dtype=np.int64)  # [B]
    first = lens if offsets is None else lens + np.asarray(offsets, dtype=np.int64)
    a[n : 4 * n].reshape(3, b, q)[:] = first[:, None] + np.arange(q)  # [3, B, q], equal streams
    a[4 * n : 4 * n + b] = slots
    a[4 * n + b : 4 * n + 2 * b] = lens
    at = 4 * n + 2 * b
    if writes is not None:
        w = np.asarray(writes, dtype=np.int64)
        if w.shape != (b, q):
            raise ValueError(f"writes must be [B, q] = {(b, q)}, got {tuple(w.shape)}")
        a[at : at + n] = w.reshape(-1)
        at += n
    table = a[at:].view(np.int32)[: b * max_pages].reshape(b, max_pages)
    table.fill(-1)
    for i, p in enumerate(pages):
        if len(p) > max_pages:
            raise ValueError(f"row {i} has {len(p)} pages, more than max_pages={max_pages}")
        table[i, : len(p)] = p
    return out


def pack_rows(out: torch.Tensor, rows: StepRows, max_pages: int) -> torch.Tensor:
    """`pack` of a `StepRows` (out: [packed_len(B, q, max_pages, rows.writes is not None)])."""
    return pack(
        out, rows.tokens, rows.cache_lens, rows.slots, rows.pages, max_pages, rows.offsets, rows.writes
    )


def unpack(
    flat: torch.Tensor,
    b: int,
    q: int,
    max_pages: int,
    max_kv_len: int | None = None,
    writes: bool = False,
) -> ForwardBatch:
    """Views of a packed batch (host or device) as a `ForwardBatch`; no copy."""
    n = b * q
    at = 4 * n + 2 * b + (n if writes else 0)
    return ForwardBatch(
        input_ids=flat[:n].view(b, q),  # [B, q]
        positions=flat[n : 4 * n].view(3, b, q),  # [3, B, q]
        slots=flat[4 * n : 4 * n + b],  # [B]
        page_table=flat[at:].view(torch.int32)[: b * max_pages].view(b, max_pages),
        cache_lens=flat[4 * n + b : 4 * n + 2 * b],  # [B]
        max_kv_len=max_kv_len,
        write_slots=flat[4 * n + 2 * b : at].view(b, q) if writes else None,  # [B, q]
    )


def host_buffer(words: int, device: torch.device) -> torch.Tensor:
    """A fresh flat int64 staging buffer, pinned when it is bound for a GPU (the caching host
    allocator keeps it until the copy that reads it has run, so reuse is safe)."""
    return torch.empty(words, dtype=torch.int64, pin_memory=device.type == "cuda")


@dataclass
class StepOut:
    """One forward's outputs: views of static buffers when replayed (valid until the next replay
    of the same q), fresh tensors when eager."""

    hidden: torch.Tensor  # [B, q, H] after the final norm
    logits: torch.Tensor  # [B, q, V] float32, padded ids (>= vocab_limit) at -inf
    argmax: torch.Tensor | None = None  # [B, q] int64 greedy choice (in-graph), None when eager

    def last_argmax(self) -> torch.Tensor | None:
        """[B] the in-graph argmax of each row's last position, None when eager."""
        return None if self.argmax is None else self.argmax[:, -1]

    def greedy(self) -> list[list[int]]:
        """[B][q] argmax of the logits: one device->host transfer of B*q ints."""
        top = self.argmax if self.argmax is not None else self.logits.argmax(-1)
        return top.tolist()
