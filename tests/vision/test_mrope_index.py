"""Placeholder expansion equals Qwen3VLProcessor's; MRoPE positions equal transformers' `get_rope_index`."""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest
import torch
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

from ninfer.media.mrope_index import (
    MediaGrid,
    MMTokenIds,
    build_mm_positions,
    decode_positions,
    expand_placeholders,
    token_types,
)
from tests.vision.hf_tiny import hf_vl_model

IDS = MMTokenIds()
VS, VE, IMG, VID = IDS.vision_start, IDS.vision_end, IDS.image_pad, IDS.video_pad
SPECIAL = {"<|vision_start|>": VS, "<|vision_end|>": VE, "<|image_pad|>": IMG, "<|video_pad|>": VID}


def _chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def _tokenize(text: str) -> list[int]:
    """Special tokens by id, other characters by code point (a stand-in tokenizer)."""
    out: list[int] = []
    for piece in re.split("(" + "|".join(re.escape(s) for s in SPECIAL) + ")", text):
        out.extend([SPECIAL[piece]] if piece in SPECIAL else _chars(piece))
    return out


@pytest.fixture(scope="module")
def hf():
    return hf_vl_model("dense")


def _hf_positions(hf, ids: list[int], images, videos):
    input_ids = torch.tensor([ids])
    types = token_types(ids)[None]
    img = torch.tensor(images, dtype=torch.int64) if images else None
    vid = torch.tensor(videos, dtype=torch.int64) if videos else None
    pos, delta = hf.model.get_rope_index(input_ids, types, image_grid_thw=img, video_grid_thw=vid)
    return pos[:, 0], int(delta[0, 0])


def test_worked_example(hf) -> None:
    """3 text, vision_start, image (1,4,6), vision_end, 2 text."""
    ids = [1, 2, 3, VS] + [IMG] * 6 + [VE, 4, 5]
    pos, delta = build_mm_positions(ids, [(1, 4, 6)])
    expect = [
        [0, 1, 2, 3, 4, 4, 4, 4, 4, 4, 7, 8, 9],
        [0, 1, 2, 3, 4, 4, 4, 5, 5, 5, 7, 8, 9],
        [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8, 9],
    ]
    assert pos.tolist() == expect and delta == -3
    ref, ref_delta = _hf_positions(hf, ids, [(1, 4, 6)], None)
    assert pos.tolist() == ref.tolist() and delta == ref_delta


def _processor_like(fps: float, indices: list[int]):
    return SimpleNamespace(
        image_token="<|image_pad|>",
        video_token="<|video_pad|>",
        vision_start_token="<|vision_start|>",
        vision_end_token="<|vision_end|>",
        image_processor=SimpleNamespace(merge_size=2),
        video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
        _calculate_timestamps=lambda i, f, m: Qwen3VLProcessor._calculate_timestamps(None, i, f, m),
    )


def _random_prompt(rng: random.Random):
    """A template-shaped prompt with text, images and videos, and the grids / metadata behind it."""
    text = "<|im_start|>user\n"
    items: list[MediaGrid] = []
    metas = []
    for _ in range(rng.randint(1, 4)):
        text += "x" * rng.randint(0, 5)
        if rng.random() < 0.5:
            grid = (1, 2 * rng.randint(1, 5), 2 * rng.randint(1, 5))
            items.append(MediaGrid("image", grid))
            metas.append(None)
            text += "<|vision_start|><|image_pad|><|vision_end|>"
        else:
            frames = rng.randint(1, 7)
            fps = rng.choice([1.0, 2.0, 24.0, 29.97])
            indices = sorted(rng.sample(range(40), frames))
            grid = ((frames + 1) // 2, 2 * rng.randint(1, 3), 2 * rng.randint(1, 3))
            stamps = Qwen3VLProcessor._calculate_timestamps(None, list(indices), fps, 2)
            items.append(MediaGrid("video", grid, tuple(stamps)))
            metas.append((fps, indices))
            text += "<|vision_start|><|video_pad|><|vision_end|>"
    return text + "y<|im_end|>", items, metas


def _reference_expansion(text: str, items, metas) -> str:
    """Qwen3VLProcessor's own replace_image_token / replace_video_token, applied in order."""
    parts = re.split("(<\\|image_pad\\|>|<\\|video_pad\\|>)", text)
    out, k = "", 0
    for piece in parts:
        if piece not in ("<|image_pad|>", "<|video_pad|>"):
            out += piece
            continue
        item, meta = items[k], metas[k]
        grid = torch.tensor([item.grid_thw])
        if item.modality == "image":
            out += Qwen3VLProcessor.replace_image_token(_processor_like(0, []), {"image_grid_thw": grid}, 0)
        else:
            fps, indices = meta
            md = SimpleNamespace(fps=fps, frames_indices=list(indices))
            inputs = {"video_grid_thw": grid, "video_metadata": [md]}
            out += Qwen3VLProcessor.replace_video_token(_processor_like(fps, indices), inputs, 0)
        k += 1
    return out


@pytest.mark.parametrize("seed", range(12))
def test_expansion_and_positions_match(hf, seed: int) -> None:
    rng = random.Random(seed)
    text, items, metas = _random_prompt(rng)
    expanded = expand_placeholders(_tokenize(text), items, _chars)
    assert expanded.token_ids == _tokenize(_reference_expansion(text, items, metas))
    for span in expanded.spans:
        run = expanded.token_ids[span.start : span.start + span.length]
        pad = IMG if items[span.item].modality == "image" else VID
        assert run == [pad] * span.length
        assert expanded.token_ids[span.start - 1] == VS and expanded.token_ids[span.start + span.length] == VE
    images = [i.grid_thw for i in items if i.modality == "image"]
    videos = [i.grid_thw for i in items if i.modality == "video"]
    pos, delta = build_mm_positions(expanded.token_ids, images, videos)
    ref, ref_delta = _hf_positions(hf, expanded.token_ids, images, videos)
    assert pos.tolist() == ref.tolist() and delta == ref_delta


def test_text_only_and_decode() -> None:
    pos, delta = build_mm_positions([5, 6, 7])
    assert pos.tolist() == [[0, 1, 2]] * 3 and delta == 0
    ids = [1, VS] + [IMG] * 12 + [VE]
    pos, delta = build_mm_positions(ids, [(1, 4, 12)])
    full, _ = build_mm_positions([*ids, 9, 9], [(1, 4, 12)])
    assert decode_positions(len(ids), 2, delta).tolist() == full[:, len(ids) :].tolist()


def test_mismatches_raise() -> None:
    with pytest.raises(ValueError, match="does not match grid"):
        build_mm_positions([VS] + [IMG] * 5 + [VE], [(1, 4, 6)])
    with pytest.raises(ValueError, match="no image grid"):
        build_mm_positions([VS, IMG, VE])
    with pytest.raises(ValueError, match="more media grids"):
        build_mm_positions([1, 2], [(1, 2, 2)])
    with pytest.raises(ValueError, match="placeholder is image"):
        expand_placeholders([IMG], [MediaGrid("video", (1, 2, 2), (0.0,))], _chars)
    with pytest.raises(ValueError, match="2 media items"):
        expand_placeholders([IMG], [MediaGrid("image", (1, 2, 2))] * 2, _chars)
