"""Image preparation equals transformers' PIL Qwen2VL processor (bit-exact BF16 of its float32 output)."""

from __future__ import annotations

import base64
import io

import pytest
import torch
from PIL import Image, ImageOps
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from ninfer.media.config import ImageProcessing
from ninfer.media.errors import MediaError
from ninfer.media.image import decode_image, load_image
from ninfer.media.pixels import smart_resize
from tests.vision.media_samples import encode, samples, smooth_rgb

SAMPLES = samples()
CAP = 1 << 26


def _processor(cfg: ImageProcessing) -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(
        size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
        patch_size=cfg.patch_size,
        temporal_patch_size=cfg.temporal_patch_size,
        merge_size=cfg.merge_size,
        image_mean=list(cfg.image_mean),
        image_std=list(cfg.image_std),
    )


def _check(data: bytes, cfg: ImageProcessing, reference_input) -> None:
    ref = _processor(cfg)(images=reference_input, return_tensors="pt")
    got = load_image(data, cfg, CAP)
    assert got.grid_thw == tuple(ref["image_grid_thw"][0].tolist())
    assert got.patches.dtype == torch.bfloat16
    assert torch.equal(got.patches, ref["pixel_values"].to(torch.bfloat16))


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_matches_processor_on_pil_input(name: str) -> None:
    """Reference: the processor on the EXIF-transposed PIL image (its convert_to_rgb does the mode conversion)."""
    data = SAMPLES[name]
    _check(data, ImageProcessing(), ImageOps.exif_transpose(Image.open(io.BytesIO(data))))


@pytest.mark.parametrize(
    "name", ["rgb_png", "palette_png", "gray_png", "exif_rotated_jpeg", "cmyk_jpeg", "tiny_png"]
)
def test_matches_processor_on_data_uri(name: str) -> None:
    """Opaque images: the processor's own URL path (`load_image`: EXIF transpose + RGB) agrees."""
    data = SAMPLES[name]
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    _check(data, ImageProcessing(), uri)


def test_downscale_branch_and_custom_config() -> None:
    cfg = ImageProcessing(min_pixels=32 * 32, max_pixels=256 * 256)
    data = encode(Image.fromarray(smooth_rgb(700, 500, 5)))
    _check(data, cfg, Image.open(io.BytesIO(data)))
    assert cfg == ImageProcessing.from_hf({"size": {"shortest_edge": 1024, "longest_edge": 65536}})


def test_exif_orientation_is_applied() -> None:
    got = decode_image(SAMPLES["exif_rotated_jpeg"], CAP)
    assert got.size == (180, 320)


def test_smart_resize_matches_transformers() -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as ref

    for h, w in [(1, 1), (7, 5), (200, 300), (31, 33), (4000, 3000), (10000, 60), (333, 777)]:
        for lo, hi in [(65536, 16777216), (1024, 65536)]:
            assert smart_resize(h, w, 32, lo, hi) == ref(h, w, 32, lo, hi)


def test_refusals() -> None:
    with pytest.raises(MediaError) as e:
        load_image(SAMPLES["large_jpeg"], ImageProcessing(), 1000 * 1000)
    assert e.value.code == "media_budget_exceeded"
    with pytest.raises(MediaError) as e:
        load_image(b"not an image", ImageProcessing(), CAP)
    assert e.value.code == "invalid_media"
    with pytest.raises(MediaError) as e:
        load_image(SAMPLES["rgb_png"][:200], ImageProcessing(), CAP)
    assert e.value.code == "invalid_media"
    with pytest.raises(MediaError) as e:
        load_image(encode(Image.new("RGB", (2010, 10))), ImageProcessing(), CAP)
    assert e.value.code == "invalid_media" and "aspect" in e.value.message
