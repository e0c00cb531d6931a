"""Video preparation vs transformers: PyAV reading + Qwen3VLVideoProcessor sampling, smart_resize, patchify.

torchvision cannot be imported beside this torch build, so the processor's resize/normalise step
(torchvision v2 on CPU: uint8 bicubic antialiased `interpolate`, then ``(x - 255·mean) / (255·std)``)
is reproduced here from torchvision's documented algorithm; everything else is transformers' code.
"""

from __future__ import annotations

import io
from functools import partial
from types import SimpleNamespace

import av
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as ref_smart_resize
from transformers.video_utils import read_video_pyav

from ninfer.media.config import VideoProcessing
from ninfer.media.errors import MediaError
from ninfer.media.video import load_video, video_smart_resize
from tests.vision.media_samples import smooth_rgb

CAP = 1 << 30


def make_video(
    frames: int, fps: int, width: int, height: int, fmt: str = "mp4", codec: str = "mpeg4"
) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            img = np.roll(smooth_rgb(width, height, i % 3), 3 * i, axis=1)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def _reference(data: bytes, cfg: VideoProcessing):
    proc = Qwen3VLVideoProcessor(
        size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
        fps=cfg.fps,
        min_frames=cfg.min_frames,
        max_frames=cfg.max_frames,
    )
    video, meta = read_video_pyav(io.BytesIO(data), sample_indices_fn=partial(proc.sample_frames))
    frames = torch.from_numpy(video).permute(0, 3, 1, 2)[None]  # [1, F, 3, H, W]
    h, w = ref_smart_resize(
        frames.shape[1], frames.shape[-2], frames.shape[-1], 2, 32, cfg.min_pixels, cfg.max_pixels
    )
    flat = frames[0]
    if (h, w) != tuple(flat.shape[-2:]):
        flat = F.interpolate(flat, size=(h, w), mode="bicubic", antialias=True)
    mean = torch.tensor(cfg.image_mean) * 255.0
    std = torch.tensor(cfg.image_std) * 255.0
    norm = ((flat.float() - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1))[None]
    patches, t, gh, gw = proc.patchify(norm, patch_size=16, merge_size=2, temporal_patch_size=2)
    stamps = Qwen3VLProcessor._calculate_timestamps(None, meta.frames_indices, meta.fps, 2)
    return patches[0], (t, gh, gw), stamps, flat


CASES = [
    (16, 8, 96, 64, "mp4", "mpeg4"),
    (30, 10, 100, 76, "mp4", "mpeg4"),
    (3, 24, 64, 48, "mp4", "mpeg4"),
    (25, 25, 320, 240, "avi", "mpeg4"),
    (12, 6, 40, 200, "mp4", "mpeg4"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}f{c[1]}fps{c[2]}x{c[3]}{c[4]}" for c in CASES])
def test_matches_reference(case) -> None:
    data = make_video(*case)
    cfg = VideoProcessing(min_pixels=4096, max_pixels=64 * 32 * 32)
    got = load_video(data, cfg, CAP)
    patches, grid, stamps, _ = _reference(data, cfg)
    assert got.grid_thw == grid
    assert got.timestamps == pytest.approx(tuple(stamps), abs=0) and len(got.timestamps) == grid[0]
    assert torch.equal(got.patches, patches.to(torch.bfloat16))


def test_resize_is_close_to_pil_bicubic() -> None:
    """The uint8 antialiased bicubic stays within one level of PIL's bicubic (sanity of the reproduction)."""
    img = smooth_rgb(333, 222)
    pil = np.asarray(Image.fromarray(img).resize((160, 96), Image.Resampling.BICUBIC)).astype(int)
    ours = F.interpolate(
        torch.from_numpy(img).permute(2, 0, 1)[None], size=(96, 160), mode="bicubic", antialias=True
    )
    assert np.abs(ours[0].permute(1, 2, 0).numpy().astype(int) - pil).max() <= 1


def test_default_config_and_sampling() -> None:
    data = make_video(40, 10, 128, 96)
    got = load_video(data, VideoProcessing(), CAP)
    patches, grid, stamps, _ = _reference(data, VideoProcessing())
    assert got.grid_thw == grid and grid[0] == 4 and torch.equal(got.patches, patches.to(torch.bfloat16))
    assert got.timestamps == tuple(stamps)


def test_smart_resize_matches_transformers() -> None:
    for t, h, w in [(2, 10, 10), (4, 480, 640), (8, 1080, 1920), (300, 720, 1280), (3, 31, 900)]:
        for lo, hi in [(4096, 786432), (131072, 25165824)]:
            assert video_smart_resize(t, h, w, 2, 32, lo, hi) == ref_smart_resize(t, h, w, 2, 32, lo, hi)


def test_refusals() -> None:
    data = make_video(8, 4, 64, 48)
    with pytest.raises(MediaError) as e:
        load_video(data, VideoProcessing(), 64 * 48 * 3)
    assert e.value.code == "media_budget_exceeded"
    with pytest.raises(MediaError) as e:
        load_video(b"\x00" * 100, VideoProcessing(), CAP)
    assert e.value.code == "invalid_media"
    with pytest.raises(MediaError) as e:
        load_video(make_video(1, 4, 64, 48), VideoProcessing(), CAP)
    assert e.value.code == "invalid_media"


def test_processor_placeholder_uses_these_timestamps() -> None:
    data = make_video(16, 8, 96, 64)
    got = load_video(data, VideoProcessing(), CAP)
    fake = SimpleNamespace(
        vision_start_token="<|vision_start|>",
        vision_end_token="<|vision_end|>",
        video_token="<|video_pad|>",
        video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
        _calculate_timestamps=lambda i, f, m: Qwen3VLProcessor._calculate_timestamps(None, i, f, m),
    )
    meta = SimpleNamespace(fps=8.0, frames_indices=[0, 5, 10, 15])
    text = Qwen3VLProcessor.replace_video_token(
        fake, {"video_grid_thw": torch.tensor([got.grid_thw]), "video_metadata": [meta]}, 0
    )
    assert [f"<{t:.1f} seconds>" in text for t in got.timestamps] == [True] * len(got.timestamps)
