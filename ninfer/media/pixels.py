"""Shared pixel math: smart_resize, rescale + normalize to the processor's float32 values, BF16 patchify."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ninfer.media.errors import INVALID_MEDIA, MediaError


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """`Qwen2VLImageProcessor`'s target (H, W): multiples of `factor`, area within [min, max], aspect kept."""
    if max(height, width) / min(height, width) > 200:
        raise MediaError(INVALID_MEDIA, f"image aspect ratio {width}x{height} exceeds 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def normalize_uint8(
    image: np.ndarray, rescale: float, mean: Sequence[float], std: Sequence[float]
) -> np.ndarray:
    """[C, H, W] uint8 -> float32 exactly as the PIL processor: (x * rescale in f64 -> f32 - mean) / std in f32."""
    out = np.empty(image.shape, dtype=np.float32)
    for c in range(image.shape[0]):  # channel by channel keeps the float64 temporary small
        x = (image[c].astype(np.float64) * rescale).astype(np.float32)
        out[c] = (x - np.float32(mean[c])) / np.float32(std[c])
    return out


def patchify(
    frames: torch.Tensor, patch: int, merge: int, temporal: int
) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """frames [F, C, H, W] -> patches [t*h*w, C*temporal*patch*patch] in merge-block order, grid (t, h, w).

    A frame count that is not a multiple of `temporal` is padded by repeating the last frame
    (a still image, F=1, becomes `temporal` identical frames)."""
    f, c, hh, ww = frames.shape
    if pad := -f % temporal:
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
        f += pad
    t, h, w = f // temporal, hh // patch, ww // patch
    x = frames.reshape(t, temporal, c, h // merge, merge, patch, w // merge, merge, patch)
    # -> [t, h/m, w/m, m, m, C, temporal, patch, patch]
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(t * h * w, c * temporal * patch * patch).contiguous(), (t, h, w)
