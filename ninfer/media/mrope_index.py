"""Media placeholder expansion and 3-axis MRoPE position ids (transformers 5.24 `get_rope_index`).

Media-prompt API (pure: token ids and grids in, ids / spans / positions out; no model dependency):

* `expand_placeholders(token_ids, items, encode_text, ids) -> ExpandedPrompt`: the rendered prompt
  holds one ``<|image_pad|>`` / ``<|video_pad|>`` per media item (`ninfer.frontend.encode`); each
  becomes ``t*h*w / merge²`` image pads, or, for a video, per temporal patch
  ``<{ts:.1f} seconds><|vision_start|>`` + pads + ``<|vision_end|>`` (`Qwen3VLProcessor`).
  `ExpandedPrompt.spans` are the consumer spans: where each item's / frame's merged vision rows
  land in the token sequence (scatter target, prefix-reuse key).
* `build_mm_positions(token_ids, image_grids, video_grids) -> (positions [3, T] int64, rope_delta)`.
* `decode_positions(cache_len, n, rope_delta) -> [3, n]`: positions of tokens appended after a
  multimodal prefix (prefill continuation or decode), all three streams equal.

Grids are (t, h, w) in 16-px patches, before the spatial merge, as `ninfer.media` prepares them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

TEXT, IMAGE, VIDEO = 0, 1, 2


@dataclass(frozen=True)
class MMTokenIds:
    """Multimodal special-token ids (`Qwen3_5Config` defaults)."""

    image_pad: int = 248056
    video_pad: int = 248057
    vision_start: int = 248053
    vision_end: int = 248054


@dataclass(frozen=True)
class MediaGrid:
    """One prepared media item: modality ``image`` | ``video``, grid (t, h, w), per-temporal-patch timestamps."""

    modality: str
    grid_thw: tuple[int, int, int]
    timestamps: tuple[float, ...] = ()


class MediaLike(Protocol):
    """What expansion reads of an item (`MediaGrid`, or `ninfer.media.config.PreparedMedia` itself)."""

    @property
    def modality(self) -> str: ...

    @property
    def grid_thw(self) -> tuple[int, int, int]: ...

    @property
    def timestamps(self) -> tuple[float, ...]: ...


@dataclass(frozen=True)
class MediaSpan:
    """Placeholder run of item `item` (frame `frame` of a video; 0 for an image) at tokens [start, start+length)."""

    item: int
    frame: int
    start: int
    length: int


@dataclass(frozen=True)
class ExpandedPrompt:
    """Token ids after expansion and the consumer span of every image / video frame, in order."""

    token_ids: list[int]
    spans: list[MediaSpan] = field(default_factory=list)


def merged_tokens(grid_thw: Sequence[int], merge: int = 2) -> int:
    """Merged vision tokens of one item: t*h*w / merge²."""
    t, h, w = grid_thw
    return t * h * w // (merge * merge)


def expand_placeholders(
    token_ids: Sequence[int],
    items: Sequence[MediaLike],
    encode_text: Callable[[str], list[int]],
    ids: MMTokenIds = MMTokenIds(),
    merge: int = 2,
) -> ExpandedPrompt:
    """Replace the k-th media pad of `token_ids` by the expansion of `items[k]` (modalities must agree)."""
    out: list[int] = []
    spans: list[MediaSpan] = []
    k = 0
    for tok in token_ids:
        if tok not in (ids.image_pad, ids.video_pad):
            out.append(tok)
            continue
        if k >= len(items):
            raise ValueError(f"prompt has more media placeholders than the {len(items)} media items")
        item = items[k]
        want = "image" if tok == ids.image_pad else "video"
        if item.modality != want:
            raise ValueError(f"media item {k} is {item.modality} but its placeholder is {want}")
        t, h, w = item.grid_thw
        if want == "image":
            n = merged_tokens(item.grid_thw, merge)
            spans.append(MediaSpan(k, 0, len(out), n))
            out.extend([ids.image_pad] * n)
        else:
            if len(item.timestamps) != t:
                raise ValueError(
                    f"video item {k}: {len(item.timestamps)} timestamps for {t} temporal patches"
                )
            per_frame = h * w // (merge * merge)
            for f, ts in enumerate(item.timestamps):
                out.extend(encode_text(f"<{ts:.1f} seconds>"))
                out.append(ids.vision_start)
                spans.append(MediaSpan(k, f, len(out), per_frame))
                out.extend([ids.video_pad] * per_frame)
                out.append(ids.vision_end)
        k += 1
    if k != len(items):
        raise ValueError(f"{len(items)} media items but {k} placeholders in the prompt")
    return ExpandedPrompt(out, spans)


def token_types(token_ids: Sequence[int], ids: MMTokenIds = MMTokenIds()) -> torch.Tensor:
    """`mm_token_type_ids`: 0 text, 1 image pad, 2 video pad -> [T] int64."""
    t = torch.as_tensor(list(token_ids), dtype=torch.int64)
    types = torch.zeros_like(t)
    types[t == ids.image_pad] = IMAGE
    types[t == ids.video_pad] = VIDEO
    return types


def build_mm_positions(
    token_ids: Sequence[int],
    image_grids: Sequence[Sequence[int]] = (),
    video_grids: Sequence[Sequence[int]] = (),
    ids: MMTokenIds = MMTokenIds(),
    merge: int = 2,
) -> tuple[torch.Tensor, int]:
    """3-axis positions [3, T] int64 and rope_delta (= max(pos) + 1 - T) of one expanded sequence.

    Each maximal run of equal token type is a group (text, image pads, video pads); an image group
    takes the next image grid, a video group the next video frame (videos are split into t grids
    of t=1, as timestamps separate their frames). A vision group at ``cur`` gets T = cur,
    H = cur + row, W = cur + col over the merged (h/m, w/m) grid; then cur += max(h, w)/m.
    """
    types = token_types(token_ids, ids).tolist()
    images = iter([tuple(int(v) for v in g) for g in image_grids])
    frames = iter([(1, int(h), int(w)) for t, h, w in video_grids for _ in range(int(t))])
    parts: list[torch.Tensor] = []
    cur = 0
    pos = 0
    for kind, group in itertools.groupby(types):
        n = sum(1 for _ in group)
        if kind == TEXT:
            parts.append((torch.arange(n) + cur).view(1, -1).expand(3, -1))
            cur += n
        else:
            source = images if kind == IMAGE else frames
            grid = next(source, None)
            if grid is None:
                raise ValueError(
                    f"no {'image' if kind == IMAGE else 'video'} grid left for the pads at token {pos}"
                )
            t, h, w = grid[0], grid[1] // merge, grid[2] // merge
            if t * h * w != n:
                raise ValueError(
                    f"pad run of {n} tokens at {pos} does not match grid {grid} ({t * h * w} tokens)"
                )
            tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
            parts.append(torch.stack([tt + cur, hh + cur, ww + cur]).reshape(3, -1))
            cur += max(grid[1], grid[2]) // merge
        pos += n
    if next(images, None) is not None or next(frames, None) is not None:
        raise ValueError("more media grids than media pad runs in the prompt")
    positions = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.int64)
    delta = int(positions.max()) + 1 - len(types) if parts else 0
    return positions, delta


def decode_positions(cache_len: int, n: int, rope_delta: int) -> torch.Tensor:
    """Positions [3, n] of n tokens following `cache_len` cached ones: cache_len + i + rope_delta."""
    return (
        (torch.arange(n, dtype=torch.int64) + cache_len + rope_delta).view(1, -1).expand(3, -1).contiguous()
    )
