"""Check ninfer's video preparation against transformers' full `Qwen3VLVideoProcessor`.

The processor's resize/normalise step runs through torchvision, which does not import beside the
CPU torch build the test suite uses; this script runs in an environment that has it:

    python3 -m venv /tmp/tvenv
    /tmp/tvenv/bin/pip install torch==2.14.1 torchvision==0.29.1 "transformers>=5.2" av pillow numpy
    PYTHONPATH=. /tmp/tvenv/bin/python ops/scripts/check_video_processor.py

Exit status 0 when every generated video's patches (bf16), grid and timestamps are identical.
"""

from __future__ import annotations

import io
import sys

import av
import numpy as np
import torch
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from transformers.video_utils import VideoMetadata

from ninfer.media.config import VideoProcessing
from ninfer.media.video import load_video

CASES = [  # frames, fps, width, height, container
    (16, 8, 96, 64, "mp4"),
    (30, 10, 100, 76, "mp4"),
    (25, 25, 320, 240, "avi"),
    (12, 6, 40, 200, "mp4"),
    (40, 10, 128, 96, "mp4"),
    (9, 3, 250, 130, "mp4"),
]


def make_video(frames: int, fps: int, width: int, height: int, fmt: str) -> bytes:
    rng = np.random.default_rng(frames * 1000 + width)
    base = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            img = np.roll(base, 5 * i, axis=1)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def reference(data: bytes, cfg: VideoProcessing):
    """transformers end to end on the frames PyAV decodes (the processor samples and resizes)."""
    proc = Qwen3VLVideoProcessor(
        size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
        fps=cfg.fps,
        min_frames=cfg.min_frames,
        max_frames=cfg.max_frames,
    )
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
        fps = float(stream.average_rate)
    meta = VideoMetadata(total_num_frames=len(frames), fps=fps, frames_indices=list(range(len(frames))))
    out = proc(
        videos=[frames],
        video_metadata=[meta],
        do_sample_frames=True,
        return_metadata=True,
        return_tensors="pt",
    )
    used = out["video_metadata"][0]
    stamps = Qwen3VLProcessor._calculate_timestamps(None, used.frames_indices, used.fps, 2)
    return out["pixel_values_videos"], tuple(int(x) for x in out["video_grid_thw"][0]), stamps


def main() -> int:
    cfg = VideoProcessing(min_pixels=4096, max_pixels=64 * 32 * 32)
    failures = 0
    for case in CASES:
        data = make_video(*case)
        got = load_video(data, cfg, 1 << 30)
        want, grid, stamps = reference(data, cfg)
        same_grid = got.grid_thw == grid
        same_stamps = tuple(got.timestamps) == tuple(stamps)
        same = same_grid and torch.equal(got.patches, want.to(torch.bfloat16))
        diff = (got.patches.float() - want.float()).abs().max().item() if same_grid else float("nan")
        print(
            f"{case}: grid {got.grid_thw} vs {grid}, timestamps equal {same_stamps}, "
            f"patches identical {same} (max |diff| vs fp32 {diff:.3g})"
        )
        failures += not (same and same_stamps)
    print("OK" if failures == 0 else f"{failures} case(s) differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
