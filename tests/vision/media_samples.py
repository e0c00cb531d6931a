"""Generated test images (PNG / JPEG bytes in assorted modes) for the preprocessing tests."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def smooth_rgb(width: int, height: int, seed: int = 0) -> np.ndarray:
    """[H, W, 3] uint8: gradients plus noise, so resampling differences show."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width, 1), y * 255 / max(height, 1), (x + y) % 256], axis=-1)
    noise = rng.integers(-40, 40, size=base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def samples() -> dict[str, bytes]:
    """name -> encoded bytes."""
    rgb = Image.fromarray(smooth_rgb(300, 200))
    alpha = Image.fromarray(np.tile(np.linspace(0, 255, 300, dtype=np.uint8), (200, 1)))
    rgba = rgb.copy()
    rgba.putalpha(alpha)
    pal = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=32)
    pal_t = pal.copy()
    pal_t.info["transparency"] = 3
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 CW to view
    out = {
        "rgb_png": encode(rgb),
        "rgba_png": encode(rgba),
        "palette_png": encode(pal),
        "palette_transparent_png": encode(pal_t, transparency=3),
        "gray_png": encode(rgb.convert("L")),
        "gray_alpha_png": encode(Image.merge("LA", (rgb.convert("L"), alpha))),
        "exif_rotated_jpeg": encode(Image.fromarray(smooth_rgb(320, 180, 1)), "JPEG", exif=exif, quality=90),
        "tiny_png": encode(Image.fromarray(smooth_rgb(5, 7, 2))),
        "wide_png": encode(Image.fromarray(smooth_rgb(900, 40, 3))),
        "large_jpeg": encode(Image.fromarray(smooth_rgb(2600, 1900, 4)), "JPEG", quality=85),
        "cmyk_jpeg": encode(rgb.convert("CMYK"), "JPEG"),
        "gif": encode(pal, "GIF"),
    }
    return out
