"""The vision tower equals transformers' `model.visual` on random tiny checkpoints."""

from __future__ import annotations

import pytest
import torch

from ninfer.model.vision import VisionConfig, load_vision_tower
from tests.fp32_reorder import longest_reduction, reorder_tolerance
from tests.vision.hf_tiny import hf_vl_model, visual_tensors

GRIDS = [(1, 4, 6), (1, 8, 8), (3, 4, 2), (1, 2, 2), (2, 10, 12)]


@pytest.fixture(scope="module", params=["dense", "moe"])
def models(request):
    hf = hf_vl_model(request.param)
    cfg = VisionConfig.from_hf(hf.config.vision_config.to_dict())
    ours = load_vision_tower(cfg, visual_tensors(hf))
    return hf, ours, cfg


def test_config_from_hf(models) -> None:
    hf, _, cfg = models
    v = hf.config.vision_config
    assert (cfg.depth, cfg.hidden_size, cfg.num_heads, cfg.out_hidden_size) == (2, 32, 2, 64)
    assert cfg.patch_dim == 3 * 2 * 16 * 16 and cfg.num_position_embeddings == v.num_position_embeddings


@pytest.mark.parametrize("grids", [GRIDS[:1], GRIDS[1:3], GRIDS])
def test_tower_matches_transformers(models, grids) -> None:
    hf, ours, cfg = models
    torch.manual_seed(1)
    grid = torch.tensor(grids, dtype=torch.int64)
    n = int(grid.prod(-1).sum())
    pixels = torch.randn(n, cfg.patch_dim)
    with torch.no_grad():
        ref = hf.model.visual(pixels, grid_thw=grid).pooler_output
        got = ours(pixels, grid)
        feats = hf.model.get_image_features(pixels, image_grid_thw=grid).pooler_output
    assert got.shape == (n // 4, cfg.out_hidden_size)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
    for a, b in zip(ours.split(got, grid), feats, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_items_are_independent(models) -> None:
    _, ours, cfg = models
    grid = torch.tensor(GRIDS[:3])
    pixels = torch.randn(int(grid.prod(-1).sum()), cfg.patch_dim)
    with torch.no_grad():
        together = ours.split(ours(pixels, grid), grid)
        chunks = torch.split(pixels, grid.prod(-1).tolist())
        alone = [ours(p, g[None]) for p, g in zip(chunks, grid, strict=True)]
    k = longest_reduction(ours, int(grid.prod(-1).max()))  # GEMM widths, attention over an item
    for a, b in zip(together, alone, strict=True):  # batched GEMMs sum in another order
        torch.testing.assert_close(a, b, **reorder_tolerance(b, k))


def test_bf16_close_to_transformers_bf16(models) -> None:
    hf, _, cfg = models
    ours = load_vision_tower(cfg, visual_tensors(hf), dtype=torch.bfloat16)
    visual = hf.model.visual.to(torch.bfloat16)
    try:
        grid = torch.tensor([(1, 8, 8)])
        pixels = torch.randn(64, cfg.patch_dim).to(torch.bfloat16)
        with torch.no_grad():
            ref = visual(pixels, grid_thw=grid).pooler_output.float()
            got = ours(pixels, grid).float()
        assert (got - ref).abs().max() <= 0.05 * ref.abs().max()
    finally:
        hf.model.visual.to(torch.float32)


def test_bad_inputs_raise(models) -> None:
    _, ours, cfg = models
    with pytest.raises(ValueError, match="pixel_patches"):
        ours(torch.zeros(10, cfg.patch_dim), torch.tensor([(1, 4, 4)]))
    with pytest.raises(ValueError, match="merge blocks"):
        ours(torch.zeros(15, cfg.patch_dim), torch.tensor([(1, 3, 5)]))
    bad = dict(visual_tensors(models[0]))
    bad.pop("visual.merger.norm.bias")
    with pytest.raises(ValueError, match="missing"):
        load_vision_tower(cfg, bad)
