"""Decompression bombs below PIL's own limit: refused from the header when their decode cannot fit
the live media limit, decoded within a bounded peak when it can (measured in a fresh process from
/proc/self/status, so C allocations count), and large JPEGs decoded DCT-reduced to the same patches
within a small tolerance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ninfer.media.config import ImageProcessing
from ninfer.media.image import decode_image, load_image, pack_image, probe_image
from tests.vision.media_samples import encode

ROOT = Path(__file__).resolve().parents[2]


def _probe(side: int, bit_depth: int, live_mib: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "tests.vision.bomb_probe", str(side), str(bit_depth), str(live_mib)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_bomb_over_the_live_limit_is_refused_before_decoding() -> None:
    """13000 x 13000 1-bit PNG (20 KiB): its decode needs ~800 MiB, the live limit is 256 MiB."""
    got = _probe(13000, 1, 256)
    assert got["source_bytes"] < 32 << 10
    assert got["code"] == "media_budget_exceeded", got
    assert "live media limit of 256 MiB" in got["message"]
    assert got["hwm_growth_mib"] < 50, got
    assert got["seconds"] < 2, got


def test_gray_bomb_within_the_limit_is_decoded_with_a_bounded_peak() -> None:
    """13000 x 13000 8-bit gray PNG under the default 2048 MiB: one byte per pixel decoded, resized
    as gray (no 4-byte RGB copy of 169 Mpx), the peak stays under 200 MiB and is given back."""
    got = _probe(13000, 8, 2048)
    assert got["grid_thw"] == [1, 8, 8], got
    assert got["hwm_growth_mib"] < 200, got
    assert got["rss_growth_mib"] < 50, got


def _smooth_jpeg(side: int) -> bytes:
    rng = np.random.default_rng(7)
    small = Image.fromarray(rng.integers(0, 256, size=(24, 24, 3), dtype=np.uint8))
    return encode(small.resize((side, side), Image.Resampling.BICUBIC), "JPEG", quality=90)


def test_large_jpeg_is_decoded_reduced_to_the_same_patches() -> None:
    cfg = ImageProcessing(patch_size=16, merge_size=2, min_pixels=64, max_pixels=256 * 256)
    data = _smooth_jpeg(4200)  # 17.6 Mpx: a full decode would hold 70 MB
    plan = probe_image(data, cfg, 1 << 30)
    assert plan.scale == 8 and plan.decoded_pixels == 525 * 525
    assert plan.transient_bytes < 8 << 20
    reduced = load_image(data, cfg, 1 << 30)
    full = pack_image(decode_image(data, 1 << 30), cfg)
    assert reduced.grid_thw == full.grid_thw == (1, 16, 16)
    assert reduced.decoded_pixels == 525 * 525
    diff = (reduced.patches.float() - full.patches.float()).abs()  # values in [-1, 1]
    assert diff.mean().item() < 0.005 and diff.max().item() < 0.05, (diff.mean(), diff.max())
    assert not torch.equal(reduced.patches, full.patches)  # it really took the reduced path


def test_ordinary_jpeg_is_not_reduced() -> None:
    cfg = ImageProcessing(patch_size=16, merge_size=2, min_pixels=64, max_pixels=256 * 256)
    data = _smooth_jpeg(2000)  # 4 Mpx: 16 MB decoded, below the reduction threshold
    assert probe_image(data, cfg, 1 << 30).scale == 1
    assert torch.equal(
        load_image(data, cfg, 1 << 30).patches, pack_image(decode_image(data, 1 << 30), cfg).patches
    )
