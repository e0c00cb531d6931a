"""Helpers for engine-level VL tests: a converted tiny VL artifact, prompts with media, and runs."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ninfer.artifact.convert import convert
from ninfer.artifact.opener import open_artifact
from ninfer.bootstrap import vision_tower
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.multimodal import MultimodalPrompt
from ninfer.engine.types import GenerationRequest, SamplingParams
from ninfer.media.config import VIDEO, ImageProcessing, PreparedMedia
from ninfer.media.image import pack_image
from ninfer.media.mrope_index import MMTokenIds, build_mm_positions, expand_placeholders, token_types
from ninfer.model.weights import load_model
from tests.vision.hf_tiny import hf_vl_model
from tests.vision.media_samples import smooth_rgb

# media ids inside the tiny 512-token vocabulary
IDS = MMTokenIds(image_pad=500, video_pad=501, vision_start=502, vision_end=503)
TOP = dict(image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503)
SMALL = ImageProcessing(min_pixels=32 * 32, max_pixels=96 * 96)


@dataclass
class VL:
    hf: Any
    model: Any
    tower: Any


def build_vl(kind: str, root: Path) -> VL:
    """transformers model -> save_pretrained -> our converter -> text model + vision tower."""
    hf = hf_vl_model(kind, seed=5, **TOP)
    _sharpen(hf)
    hf.save_pretrained(root / "hf")
    art = open_artifact(convert(root / "hf", root / "vl.ninfer", template="qwen3_6"))
    model = load_model(art.config, art.load_tensors("text"), torch.float32, "cpu")
    return VL(hf, model, vision_tower(art, EngineConfig()))


def _sharpen(hf: Any) -> None:
    """Unit-scale text projections and large logits, so positions and media visibly steer greedy tokens."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "visual" in name or p.ndim < 2:
                continue
            std = 1.0 if "embed_tokens" in name else p.shape[-1] ** -0.5
            if name.startswith("lm_head"):
                std *= 3.0
            p.copy_(torch.randn(p.shape, generator=g) * std)


def image(width: int, height: int, seed: int) -> PreparedMedia:
    rgb = Image.fromarray(smooth_rgb(width, height, seed))
    digest = hashlib.sha256(np.asarray(rgb).tobytes()).hexdigest()
    return pack_image(rgb, SMALL, digest)


def video(grid: tuple[int, int, int], seed: int) -> PreparedMedia:
    g = torch.Generator().manual_seed(seed)
    t, h, w = grid
    patches = torch.randn(t * h * w, 1536, generator=g).to(torch.bfloat16)
    stamps = tuple(0.5 + 2.0 * i for i in range(t))
    return PreparedMedia(VIDEO, f"video-{seed}", patches, grid, stamps)


def encode_text(s: str) -> list[int]:
    """Stand-in tokenizer for the video timestamps (ids inside the tiny vocabulary)."""
    return [10 + (ord(c) % 50) for c in s]


@dataclass
class MMPrompt:
    ids: list[int]
    items: list[PreparedMedia]
    spans: list[Any]
    positions: torch.Tensor
    delta: int

    def multimodal(self, release: Any = None) -> MultimodalPrompt:
        return MultimodalPrompt(self.items, self.spans, self.positions, self.delta, release)

    def hf_inputs(self) -> dict[str, Any]:
        imgs = [m for m in self.items if m.modality == "image"]
        vids = [m for m in self.items if m.modality == "video"]
        out: dict[str, Any] = {
            "input_ids": torch.tensor([self.ids]),
            "mm_token_type_ids": token_types(self.ids, IDS)[None],
        }
        if imgs:
            out["pixel_values"] = torch.cat([m.patches for m in imgs]).float()
            out["image_grid_thw"] = torch.tensor([list(m.grid_thw) for m in imgs])
        if vids:
            out["pixel_values_videos"] = torch.cat([m.patches for m in vids]).float()
            out["video_grid_thw"] = torch.tensor([list(m.grid_thw) for m in vids])
        return out


def mm_prompt(raw: list[int], items: list[PreparedMedia]) -> MMPrompt:
    """`raw` holds one pad per item (in order): expand it and build the 3-axis positions."""
    exp = expand_placeholders(raw, items, encode_text, IDS)
    grids = [m.grid_thw for m in items if m.modality == "image"]
    vgrids = [m.grid_thw for m in items if m.modality == "video"]
    pos, delta = build_mm_positions(exp.token_ids, grids, vgrids, IDS)
    return MMPrompt(exp.token_ids, items, exp.spans, pos, delta)


def with_media(text: list[int], pads: list[int]) -> list[int]:
    """text, then <vs><pad><ve> per pad id, interleaved with two text ids each."""
    out = list(text)
    for i, pad in enumerate(pads):
        out += [IDS.vision_start, pad, IDS.vision_end, 30 + i, 40 + i]
    return out


def make_engine(vl: VL, reuse: bool = True, chunk: int = 16) -> Engine:
    cfg = EngineConfig(
        max_concurrency=1,
        max_pending=4,
        pending_timeout_ms=600_000,
        prefill_chunk=chunk,
        max_context=512,
        no_prefix_reuse=not reuse,
    )
    return Engine(vl.model, cfg, vision=vl.tower).start()


def generate(engine: Engine, p: MMPrompt, n: int, release: Any = None) -> tuple[list[int], Any]:
    ticket = engine.reserve()
    req = GenerationRequest(
        request_id="r",
        prompt_ids=tuple(p.ids),
        params=SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
        multimodal=p.multimodal(release),
    )
    handle = engine.submit(ticket, req)
    out: list[int] = []
    for step in handle:
        out.extend(step.token_ids)
        if step.finish_reason is not None:
            assert step.finish_reason == "length", step.error
            break
    ticket.release()
    return out, handle.stats
