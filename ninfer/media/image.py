"""Image decode (pixel cap before the full decode, EXIF orientation, RGB) and preparation to BF16 patches.

Decoding follows transformers: `load_image` applies the EXIF orientation
(`PIL.ImageOps.exif_transpose`), and the processor's RGB conversion (`convert_to_rgb`)
composites any transparency (an alpha band or a palette ``transparency`` entry) onto white;
other modes (``L``, ``P``, ``CMYK`` ...) use PIL's ``convert("RGB")``. The first frame of an
animated image is used. Resizing, rescaling, normalising and patchifying equal the PIL
`Qwen2VLImageProcessorPil` (bicubic PIL resize to `smart_resize`'s target).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import torch
from PIL import Image, ImageOps

from ninfer.media.config import IMAGE, ImageProcessing, PreparedMedia
from ninfer.media.errors import BUDGET_EXCEEDED, INVALID_MEDIA, MediaError
from ninfer.media.pixels import normalize_uint8, patchify, smart_resize


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Parse the header and refuse images over `max_pixels` before any pixel is decoded."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise MediaError(BUDGET_EXCEEDED, f"image too large to decode: {exc}") from None
    except Exception as exc:  # PIL raises many types for undecodable input
        raise MediaError(INVALID_MEDIA, f"cannot decode image: {exc}") from None
    w, h = img.size
    if w <= 0 or h <= 0:
        raise MediaError(INVALID_MEDIA, f"image has no pixels ({w}x{h})")
    if w * h > max_pixels:
        raise MediaError(
            BUDGET_EXCEEDED, f"image of {w}x{h} pixels exceeds the decoded-pixel limit {max_pixels}"
        )
    return img


def to_rgb(img: Image.Image) -> Image.Image:
    """transformers' `convert_to_rgb`: transparency composited onto white, else ``convert("RGB")``."""
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def decode_image(data: bytes, max_pixels: int) -> Image.Image:
    """Upright RGB image from encoded bytes; MediaError on undecodable or oversized input."""
    img = open_image(data, max_pixels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img.load()
            return to_rgb(ImageOps.exif_transpose(img))
    except MediaError:
        raise
    except Exception as exc:
        raise MediaError(INVALID_MEDIA, f"cannot decode image: {exc}") from None


def image_target_size(width: int, height: int, cfg: ImageProcessing) -> tuple[int, int]:
    """(H, W) after `smart_resize` for an upright image of `width` x `height`."""
    return smart_resize(height, width, cfg.patch_size * cfg.merge_size, cfg.min_pixels, cfg.max_pixels)


def prepare_image(rgb: Image.Image, cfg: ImageProcessing, digest: str = "") -> PreparedMedia:
    """Upright RGB image -> BF16 patches [h*w, 3*temporal*patch²] (merge-block order) and grid (1, h, w)."""
    height, width = image_target_size(rgb.width, rgb.height, cfg)
    resized = rgb.resize((width, height), resample=Image.Resampling.BICUBIC)
    pixels = np.asarray(resized).transpose(2, 0, 1)  # [3, H, W] uint8
    values = normalize_uint8(pixels, cfg.rescale_factor, cfg.image_mean, cfg.image_std)
    frame = torch.from_numpy(values).to(torch.bfloat16)[None]  # [1, 3, H, W]
    patches, grid = patchify(frame, cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size)
    return PreparedMedia(IMAGE, digest, patches, grid, (), rgb.width * rgb.height)


def load_image(data: bytes, cfg: ImageProcessing, max_pixels: int, digest: str = "") -> PreparedMedia:
    """Decode and prepare one image (the whole per-item build run on the worker pool)."""
    return prepare_image(decode_image(data, max_pixels), cfg, digest)
