"""Preprocessing parameters (the checkpoint's image / video processor configs) and the prepared payload."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

IMAGE = "image"
VIDEO = "video"


@dataclass(frozen=True)
class ImageProcessing:
    """`Qwen2VLImageProcessor` parameters as released with Qwen3.5/3.6 (their preprocessor_config.json)."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255

    @classmethod
    def from_hf(cls, d: Mapping[str, Any]) -> ImageProcessing:
        """From a ``preprocessor_config.json`` dict (``size`` or legacy ``min_pixels``/``max_pixels``)."""
        size = d.get("size") or {}
        return cls(
            patch_size=int(d.get("patch_size", cls.patch_size)),
            temporal_patch_size=int(d.get("temporal_patch_size", cls.temporal_patch_size)),
            merge_size=int(d.get("merge_size", cls.merge_size)),
            min_pixels=int(size.get("shortest_edge", d.get("min_pixels", cls.min_pixels))),
            max_pixels=int(size.get("longest_edge", d.get("max_pixels", cls.max_pixels))),
            image_mean=tuple(float(v) for v in d.get("image_mean", cls.image_mean)),  # type: ignore[arg-type]
            image_std=tuple(float(v) for v in d.get("image_std", cls.image_std)),  # type: ignore[arg-type]
            rescale_factor=float(d.get("rescale_factor", cls.rescale_factor)),
        )


@dataclass(frozen=True)
class VideoProcessing:
    """`Qwen3VLVideoProcessor` parameters (class defaults unless the checkpoint's video config says otherwise)."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 32 * 32 * 768
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768

    @classmethod
    def from_hf(cls, d: Mapping[str, Any]) -> VideoProcessing:
        """From a ``video_preprocessor_config.json`` dict."""
        size = d.get("size") or {}
        return cls(
            patch_size=int(d.get("patch_size", cls.patch_size)),
            temporal_patch_size=int(d.get("temporal_patch_size", cls.temporal_patch_size)),
            merge_size=int(d.get("merge_size", cls.merge_size)),
            min_pixels=int(size.get("shortest_edge", cls.min_pixels)),
            max_pixels=int(size.get("longest_edge", cls.max_pixels)),
            image_mean=tuple(float(v) for v in d.get("image_mean", cls.image_mean)),  # type: ignore[arg-type]
            image_std=tuple(float(v) for v in d.get("image_std", cls.image_std)),  # type: ignore[arg-type]
            rescale_factor=float(d.get("rescale_factor", cls.rescale_factor)),
            fps=float(d.get("fps") or cls.fps),
            min_frames=int(d.get("min_frames", cls.min_frames)),
            max_frames=int(d.get("max_frames", cls.max_frames)),
            cap_pixels_per_frame=bool(d.get("cap_pixels_per_frame") or False),
            max_video_tokens=int(d.get("max_video_tokens", cls.max_video_tokens)),
        )


@dataclass(frozen=True, eq=False)
class PreparedMedia:
    """An immutable prepared item: BF16 patches in merge-block order plus what the prompt needs.

    patches: [t*h*w, 3*temporal*patch*patch] bfloat16 (CPU); grid_thw: (t, h, w) in patches;
    timestamps: per temporal patch, seconds (videos only); digest: SHA-256 hex of the acquired bytes.
    """

    modality: str
    digest: str
    patches: torch.Tensor
    grid_thw: tuple[int, int, int]
    timestamps: tuple[float, ...] = ()
    decoded_pixels: int = 0

    @property
    def nbytes(self) -> int:
        return self.patches.numel() * self.patches.element_size()

    @property
    def raw_patches(self) -> int:
        return self.grid_thw[0] * self.grid_thw[1] * self.grid_thw[2]

    def merged_tokens(self, merge: int = 2) -> int:
        return self.raw_patches // (merge * merge)
