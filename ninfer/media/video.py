"""Video decode (PyAV), Qwen3-VL frame sampling and timestamps, and preparation to BF16 patches.

Follows transformers' `read_video_pyav` + `Qwen3VLVideoProcessor`:

* metadata: total frames = the stream's frame count (counted by demuxing when the container does
  not say), fps = the stream's average rate (24 when unknown);
* sampling: ``n = int(total / fps * cfg.fps)`` clamped to [min_frames, min(max_frames, total)],
  indices ``linspace(0, total - 1, n).round()``; only those frames are converted to RGB;
* timestamps: per temporal patch, the mean of its first and last frame time (last index repeated
  to fill the final patch);
* resize: the video `smart_resize` (temporal factor 2), then torchvision's CPU path for uint8
  bicubic, i.e. ``F.interpolate(uint8, mode="bicubic", antialias=True)`` (skipped when the size
  is unchanged); rescale + normalise fused as torchvision does: ``(x - 255*mean) / (255*std)``
  in float32; patchify with the last frame repeated to fill the final temporal patch.

The decode's transient bytes (`video_transient_bytes`: the sampled frames twice, as decoded and
stacked, plus the preparation working set) are known from the stream's metadata; `load_video`
holds them (`hold`, e.g. `MediaCache.hold`) before the first frame is decoded.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from contextlib import ExitStack

import numpy as np
import torch
import torch.nn.functional as F

from ninfer.media.config import VIDEO, PreparedMedia, VideoProcessing
from ninfer.media.errors import BUDGET_EXCEEDED, INVALID_MEDIA, MediaError
from ninfer.media.image import PREPARE_BYTES_PER_PIXEL, Hold, no_hold
from ninfer.media.pixels import patchify


def video_smart_resize(
    num_frames: int, height: int, width: int, temporal: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """`Qwen3VLVideoProcessor`'s smart_resize: frame (H, W) with t*H*W within [min, max]."""
    if num_frames < temporal:
        raise MediaError(INVALID_MEDIA, f"video has {num_frames} frame(s); at least {temporal} are needed")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise MediaError(INVALID_MEDIA, f"video aspect ratio {width}x{height} exceeds 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def sample_indices(total: int, fps: float, cfg: VideoProcessing) -> np.ndarray:
    """Qwen3-VL frame indices for a clip of `total` frames at `fps`."""
    n = int(total / fps * cfg.fps)
    n = min(max(n, cfg.min_frames), cfg.max_frames, total)
    return np.linspace(0, total - 1, n).round().astype(int)


def frame_timestamps(indices: list[int], fps: float, temporal: int) -> tuple[float, ...]:
    """Seconds per temporal patch: mean time of its first and last frame."""
    idx = list(indices)
    if len(idx) % temporal:
        idx.extend(idx[-1] for _ in range(temporal - len(idx) % temporal))
    ts = [i / fps for i in idx]
    return tuple((ts[i] + ts[i + temporal - 1]) / 2 for i in range(0, len(ts), temporal))


def video_transient_bytes(frames: int, width: int, height: int, cfg: VideoProcessing) -> int:
    """Decode + preparation working set of `frames` sampled frames of `width` x `height`."""
    pixels = frames * width * height
    return pixels * 3 * 2 + min(pixels, max(cfg.max_pixels, cfg.min_pixels)) * PREPARE_BYTES_PER_PIXEL


def decode_video(
    data: bytes, cfg: VideoProcessing, max_pixels: int, reserve: Callable[[int], None] = lambda n: None
) -> tuple[np.ndarray, list[int], float]:
    """Sampled RGB frames [F, H, W, 3] uint8, the sampled indices and the fps; pixel cap before decoding.

    `reserve(transient_bytes)` is called once the metadata is read, before any frame is decoded."""
    import av

    try:
        container = av.open(io.BytesIO(data))
    except Exception as exc:
        raise MediaError(INVALID_MEDIA, f"cannot open video: {exc}") from None
    try:
        if not container.streams.video:
            raise MediaError(INVALID_MEDIA, "media has no video stream")
        stream = container.streams.video[0]
        fps = float(stream.average_rate) if stream.average_rate else 24.0
        total = int(stream.frames)
        if total <= 0:
            total = sum(1 for p in container.demux(stream) if p.size)
            container.seek(0)
        if total <= 0:
            raise MediaError(INVALID_MEDIA, "video has no frames")
        indices = sample_indices(total, fps, cfg)
        w, h = int(stream.width), int(stream.height)
        if len(indices) * w * h > max_pixels:
            raise MediaError(
                BUDGET_EXCEEDED, f"{len(indices)} frames of {w}x{h} exceed the decoded-pixel limit"
            )
        reserve(video_transient_bytes(len(indices), w, h, cfg))
        wanted, last = set(indices.tolist()), int(indices[-1])
        frames = []
        for i, frame in enumerate(container.decode(stream)):
            if i > last:
                break
            if i in wanted:
                frames.append(frame.to_ndarray(format="rgb24"))
    except MediaError:
        raise
    except Exception as exc:
        raise MediaError(INVALID_MEDIA, f"cannot decode video: {exc}") from None
    finally:
        container.close()
    if not frames:
        raise MediaError(INVALID_MEDIA, "video has no decodable frames")
    return np.stack(frames), indices.tolist(), fps


def pack_video(
    frames: np.ndarray, indices: list[int], fps: float, cfg: VideoProcessing, digest: str = ""
) -> PreparedMedia:
    """RGB frames [F, H, W, 3] uint8 -> BF16 patches [t*h*w, 3*temporal*patch²] and grid (t, h, w)."""
    n, height, width, _ = frames.shape
    factor = cfg.patch_size * cfg.merge_size
    max_pixels = cfg.max_pixels
    if cfg.cap_pixels_per_frame:
        per_frame = max(
            min(cfg.max_video_tokens * factor * factor, cfg.max_pixels // n), int(cfg.min_pixels * 1.05)
        )
        max_pixels = per_frame * n
    th, tw = video_smart_resize(n, height, width, cfg.temporal_patch_size, factor, cfg.min_pixels, max_pixels)
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)  # [F, 3, H, W] uint8
    if (th, tw) != (height, width):
        video = F.interpolate(video.contiguous(), size=(th, tw), mode="bicubic", antialias=True)
    mean = torch.tensor(cfg.image_mean) * (1.0 / cfg.rescale_factor)
    std = torch.tensor(cfg.image_std) * (1.0 / cfg.rescale_factor)
    values = (video.to(torch.float32) - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    patches, grid = patchify(
        values.to(torch.bfloat16), cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    )
    stamps = frame_timestamps(indices, fps, cfg.temporal_patch_size)
    return PreparedMedia(VIDEO, digest, patches, grid, stamps[: grid[0]], n * height * width)


def load_video(
    data: bytes, cfg: VideoProcessing, max_pixels: int, digest: str = "", hold: Hold = no_hold
) -> PreparedMedia:
    """Decode, sample and pack one video (the whole per-item build run on the worker pool),
    holding the transient bytes (`hold`) from the metadata read until the payload exists."""
    with ExitStack() as held:
        frames, indices, fps = decode_video(data, cfg, max_pixels, lambda n: held.enter_context(hold(n)))
        return pack_video(frames, indices, fps, cfg, digest)
