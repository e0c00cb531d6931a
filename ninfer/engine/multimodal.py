"""Multimodal prompts in the engine: the request's media, their prefix-reuse keys, and the per-chunk embeddings.

* `MultimodalPrompt` travels in `GenerationRequest.multimodal`: prepared payloads (prompt order),
  consumer spans (where each image / video frame's merged rows land), 3-axis positions of the whole
  expanded prompt and its rope_delta. The engine calls `close()` once it no longer needs the payloads
  (prefill done, or the request ended), which releases the caller's live-byte references.
* `SpanKey` / `media_prefix_limit`: a resident prefix is reusable only up to the first consumer span
  whose identity (start, length, item frame, digest, modality, grid) differs between the resident
  ledger and the new prompt. Token types follow from the token ids, and the 3-axis positions of a
  prefix are a function of its token ids and the grids inside it, so equal ids + equal span keys
  imply equal positions over the matched prefix.
* `MediaEncoder` (engine thread): encodes an item with the vision tower the first time a prefill
  chunk needs one of its rows (media wholly inside a reused prefix are never encoded), keeps the
  rows until the chunk that consumes the item's last span, and builds the chunk's input embeddings
  and positions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any, Protocol

import torch


class MediaPayload(Protocol):
    """What the engine reads of one prepared item (`ninfer.media.config.PreparedMedia`)."""

    @property
    def modality(self) -> str: ...

    @property
    def digest(self) -> str: ...

    @property
    def patches(self) -> torch.Tensor: ...  # [t*h*w, patch_dim] (host, BF16)

    @property
    def grid_thw(self) -> tuple[int, int, int]: ...


class SpanLike(Protocol):
    """`ninfer.media.mrope_index.MediaSpan`: item `item` (frame `frame`) at tokens [start, start+length)."""

    @property
    def item(self) -> int: ...

    @property
    def frame(self) -> int: ...

    @property
    def start(self) -> int: ...

    @property
    def length(self) -> int: ...


@dataclass(frozen=True)
class SpanKey:
    """Identity of one consumer span for prefix matching."""

    start: int
    length: int
    frame: int
    digest: str
    modality: str
    grid: tuple[int, int, int]


@dataclass(eq=False)
class MultimodalPrompt:
    """The media of one expanded prompt (positions [3, T] int64 cover every prompt token)."""

    items: Sequence[MediaPayload]
    spans: Sequence[SpanLike]
    positions: torch.Tensor  # [3, T] int64
    rope_delta: int
    release: Callable[[], None] | None = None
    _closed: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        for s in self.spans:
            if not 0 <= s.item < len(self.items):
                raise ValueError(f"span of media item {s.item} but only {len(self.items)} items")

    def keys(self) -> tuple[SpanKey, ...]:
        out = []
        for s in self.spans:
            m = self.items[s.item]
            t, h, w = m.grid_thw
            out.append(SpanKey(s.start, s.length, s.frame, m.digest, m.modality, (t, h, w)))
        return tuple(out)

    def close(self) -> None:
        """Release the payload references (idempotent)."""
        if not self._closed:
            self._closed = True
            if self.release is not None:
                self.release()


def media_prefix_limit(resident: Sequence[SpanKey], prompt: Sequence[SpanKey], n: int) -> int:
    """The reusable prefix length (<= n) given the span keys of a resident ledger and of a new prompt
    whose first n token ids agree with it: cut at the first span starting before n that differs."""
    for a, b in zip_longest(resident, prompt):
        first = min(a.start if a is not None else n, b.start if b is not None else n)
        if first >= n:
            break
        if a != b:
            return first
    return n


class MediaEncoder:
    """Vision rows and input embeddings of multimodal prefill chunks (engine thread only)."""

    def __init__(self, tower: torch.nn.Module, device: torch.device) -> None:
        self.tower = tower
        self.device = device
        self._rows: dict[int, dict[int, torch.Tensor]] = {}  # id(prompt) -> item -> rows [n, H]

    def forget(self, mm: MultimodalPrompt) -> None:
        self._rows.pop(id(mm), None)

    def _item_rows(self, mm: MultimodalPrompt, k: int, cache: dict[int, torch.Tensor]) -> torch.Tensor:
        if k not in cache:
            m = mm.items[k]
            grid = torch.tensor([list(m.grid_thw)], dtype=torch.int64, device=self.device)
            cache[k] = self.tower(m.patches.to(self.device), grid)  # [t*h*w/4, H]
        return cache[k]

    def chunk(
        self, model: Any, mm: MultimodalPrompt, input_ids: torch.Tensor, start: int
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Embeddings [1, q, H] and positions [3, 1, q] of tokens [start, start+q), and the vision seconds."""
        q = input_ids.shape[-1]
        end = start + q
        x = model.embed_tokens(input_ids.view(1, q))  # [1, q, H]
        cache = self._rows.setdefault(id(mm), {})
        seconds = 0.0
        last_end: dict[int, int] = {}
        for s in mm.spans:
            last_end[s.item] = max(last_end.get(s.item, 0), s.start + s.length)
        for s in mm.spans:
            a, b = max(s.start, start), min(s.start + s.length, end)
            if a >= b:
                continue
            t0 = time.perf_counter()
            rows = self._item_rows(mm, s.item, cache)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            seconds += time.perf_counter() - t0
            base = s.frame * s.length  # a video frame's rows follow the earlier frames' rows
            x[0, a - start : b - start] = rows[base + a - s.start : base + b - s.start].to(x.dtype)
        for k, e in last_end.items():  # rows no later chunk needs
            if e <= end:
                cache.pop(k, None)
        if not cache:
            self._rows.pop(id(mm), None)
        positions = mm.positions[:, start:end].to(self.device).view(3, 1, q)
        return x, positions, seconds
