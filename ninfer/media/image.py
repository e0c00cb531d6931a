"""Image decode (pixel cap before the full decode, EXIF orientation, RGB) and preparation to BF16 patches.

Decoding follows transformers: `load_image` applies the EXIF orientation
(`PIL.ImageOps.exif_transpose`), and the processor's RGB conversion (`convert_to_rgb`)
composites any transparency (an alpha band or a palette ``transparency`` entry) onto white;
other modes (``L``, ``P``, ``CMYK`` ...) use PIL's ``convert("RGB")``. The first frame of an
animated image is used. Resizing, rescaling, normalising and patchifying equal the PIL
`Qwen2VLImageProcessorPil` (bicubic PIL resize to `smart_resize`'s target).

Before any pixel is decoded, `plan_image` reads the header (size, mode, transparency, declared
orientation) and works out what the decode will cost: the pixels it decodes and the transient
bytes of the decode, the mode conversion and the preparation (`ImagePlan.transient_bytes`), so
the caller can charge them to the request's budgets and hold them against the live media limit
before they exist. A JPEG whose full decode would take more than `REDUCED_DECODE_ABOVE_BYTES` is
decoded at a DCT-reduced scale (`Image.draft`: 1/2, 1/4 or 1/8, never below the resize target);
ordinary images decode at full size, so their patches stay equal to transformers'.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageOps

from ninfer.media.config import IMAGE, ImageProcessing, PreparedMedia
from ninfer.media.errors import BUDGET_EXCEEDED, INVALID_MEDIA, MediaError
from ninfer.media.pixels import normalize_uint8, patchify, smart_resize

# A JPEG whose full-size decode needs more than this is decoded DCT-reduced (64 MiB: 16 Mpx).
REDUCED_DECODE_ABOVE_BYTES = 64 << 20
# Preparation's working set per target pixel: the resized image (4), its uint8 array (3), the
# float32 values (12) with one float64 channel temporary (8), BF16 frames padded to the temporal
# patch (12) and the patch copy (12), rounded up.
PREPARE_BYTES_PER_PIXEL = 64
ORIENTATION_TAG = 0x0112

Hold = Callable[[int], AbstractContextManager[object]]


def no_hold(nbytes: int) -> AbstractContextManager[object]:
    return nullcontext()


@dataclass(frozen=True)
class ImagePlan:
    """What decoding and preparing one image will cost, from its header alone."""

    width: int  # stored size
    height: int
    scale: int  # JPEG DCT reduction (1 = full size)
    decoded_pixels: int  # pixels the decode produces (after the reduction)
    target: tuple[int, int]  # (H, W) of the resize, upright as far as the header says
    raw_patches: int
    transient_bytes: int  # decode + conversion + preparation working set


def _bytes_per_pixel(mode: str) -> int:
    """PIL's in-memory pixel size: 1 for 8-bit single-band modes, 2 for 16-bit, else 4 (RGB is RGBX)."""
    if mode in ("1", "L", "P"):
        return 1
    return 2 if mode.startswith("I;16") else 4


def _declared_orientation(img: Image.Image) -> int:
    """The EXIF orientation the header already carries (1 when none is known without decoding)."""
    if "exif" not in img.info:
        return 1  # a PNG's getexif() would decode the whole image to look for a late eXIf chunk
    try:
        return int(img.getexif().get(ORIENTATION_TAG, 1))
    except Exception:
        return 1


def plan_image(img: Image.Image, cfg: ImageProcessing) -> ImagePlan:
    """The decode plan of an opened (header-only) image; MediaError for sizes the resize refuses."""
    w, h = img.size
    factor = cfg.patch_size * cfg.merge_size
    th, tw = smart_resize(h, w, factor, cfg.min_pixels, cfg.max_pixels)  # stored orientation
    scale = 1
    if img.format == "JPEG" and w * h * _bytes_per_pixel(img.mode) > REDUCED_DECODE_ABOVE_BYTES:
        scale = next((s for s in (8, 4, 2) if w // tw >= s and h // th >= s), 1)
    dw, dh = -(-w // scale), -(-h // scale)
    pixels = dw * dh
    decode = pixels * _bytes_per_pixel(img.mode)
    if _has_transparency(img):
        convert = pixels * 16  # RGBA copy, white background, composite, RGB result
    elif img.mode in ("L", "1"):
        convert = pixels if img.mode == "1" else 0  # resized as gray, converted once small
    elif img.mode != "RGB":
        convert = pixels * 4
    else:
        convert = 0
    orientation = _declared_orientation(img)
    transpose = decode if orientation > 1 else 0
    upright = (tw, th) if orientation in (5, 6, 7, 8) else (th, tw)
    transient = decode + max(convert, transpose) + th * tw * PREPARE_BYTES_PER_PIXEL
    patches = (th // cfg.patch_size) * (tw // cfg.patch_size)
    return ImagePlan(w, h, scale, pixels, upright, patches, transient)


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


def probe_image(data: bytes, cfg: ImageProcessing, max_pixels: int) -> ImagePlan:
    """The plan of encoded bytes (header only); `max_pixels` caps the pixels actually decoded."""
    with open_image(data, 1 << 62) as img:
        plan = plan_image(img, cfg)
    if plan.decoded_pixels > max_pixels:
        raise MediaError(
            BUDGET_EXCEEDED,
            f"image of {plan.width}x{plan.height} pixels exceeds the decoded-pixel limit {max_pixels}",
        )
    return plan


def _has_transparency(img: Image.Image) -> bool:
    return "A" in img.getbands() or img.info.get("transparency") is not None


def to_rgb(img: Image.Image, keep_gray: bool = False) -> Image.Image:
    """transformers' `convert_to_rgb`: transparency composited onto white, else ``convert("RGB")``.

    An RGB image without transparency is returned as is (``convert`` would only copy it); with
    `keep_gray` an opaque gray image stays one band (``L``): PIL resamples each band of an RGB
    image alike, so resizing the gray band and converting the result equals converting first."""
    if _has_transparency(img):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if img.mode == "RGB" or (keep_gray and img.mode == "L"):
        return img
    return img.convert("L" if keep_gray and img.mode == "1" else "RGB")


def decode_image(
    data: bytes, max_pixels: int, plan: ImagePlan | None = None, keep_gray: bool = False
) -> Image.Image:
    """Upright RGB image from encoded bytes; MediaError on undecodable or oversized input.

    With a `plan` whose scale is above 1 the JPEG is decoded DCT-reduced by that scale; with
    `keep_gray` an opaque gray image is returned as ``L`` (see `to_rgb`)."""
    img = open_image(data, max_pixels if plan is None or plan.scale == 1 else 1 << 62)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            if plan is not None and plan.scale > 1:
                img.draft(img.mode, (img.width // plan.scale, img.height // plan.scale))
            img.load()
            ImageOps.exif_transpose(img, in_place=True)
            return to_rgb(img, keep_gray)
    except MediaError:
        raise
    except Exception as exc:
        raise MediaError(INVALID_MEDIA, f"cannot decode image: {exc}") from None


def image_target_size(width: int, height: int, cfg: ImageProcessing) -> tuple[int, int]:
    """(H, W) after `smart_resize` for an upright image of `width` x `height`."""
    return smart_resize(height, width, cfg.patch_size * cfg.merge_size, cfg.min_pixels, cfg.max_pixels)


def pack_image(
    rgb: Image.Image, cfg: ImageProcessing, digest: str = "", target: tuple[int, int] | None = None
) -> PreparedMedia:
    """Upright RGB (or opaque gray ``L``) image -> BF16 patches [h*w, 3*temporal*patch²]
    (merge-block order) and grid (1, h, w).

    `target` (H, W) overrides the size `smart_resize` picks from the image's own size (a reduced
    decode resizes to the target of the full-size image)."""
    height, width = target or image_target_size(rgb.width, rgb.height, cfg)
    resized = rgb.resize((width, height), resample=Image.Resampling.BICUBIC).convert("RGB")
    del rgb
    pixels = np.asarray(resized).transpose(2, 0, 1)  # [3, H, W] uint8
    values = normalize_uint8(pixels, cfg.rescale_factor, cfg.image_mean, cfg.image_std)
    frame = torch.from_numpy(values).to(torch.bfloat16)[None]  # [1, 3, H, W]
    patches, grid = patchify(frame, cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size)
    return PreparedMedia(IMAGE, digest, patches, grid, ())


def load_image(
    data: bytes, cfg: ImageProcessing, max_pixels: int, digest: str = "", hold: Hold = no_hold
) -> PreparedMedia:
    """Plan, then decode and pack one image (the whole per-item build run on the worker pool).

    `hold(transient_bytes)` is entered before the decode and left once the payload exists."""
    plan = probe_image(data, cfg, max_pixels)
    with hold(plan.transient_bytes):
        rgb = decode_image(data, max_pixels, plan, keep_gray=True)
        media = pack_image(rgb, cfg, digest, plan.target if plan.scale > 1 else None)
    return PreparedMedia(IMAGE, digest, media.patches, media.grid_thw, (), plan.decoded_pixels)
