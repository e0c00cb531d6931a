"""The DFlash drafter module against the `dflash` package's DFlashDraftModel (fp32, tiny random weights)."""

from __future__ import annotations

import pytest
import torch
from dflash.model import DFlashDraftModel, build_target_layer_ids
from transformers import Qwen3Config

from ninfer.model.dflash import DFlashConfig, default_target_layers, load_dflash
from tests.fp32_reorder import longest_reduction, reorder_tolerance

H, TARGET_LAYERS = 32, 8


def _hf_config(
    layer_types: list[str] | None = None, ids: list[int] | None = None, window: bool = False
) -> dict:
    d = {
        "architectures": ["DFlashDraftModel"],
        "hidden_size": H,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 48,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000.0,
        "vocab_size": 64,
        "num_target_layers": TARGET_LAYERS,
        "dflash_config": {"block_size": 6, "mask_token_id": 63, **({"target_layer_ids": ids} if ids else {})},
    }
    if layer_types:
        d |= {"layer_types": layer_types, "sliding_window": 5, "use_sliding_window": window}
    return d


def _pair(d: dict) -> tuple[DFlashDraftModel, torch.nn.Module]:
    torch.manual_seed(0)
    ref = DFlashDraftModel(Qwen3Config(**{k: v for k, v in d.items() if k != "architectures"})).float().eval()
    with torch.no_grad():
        for p in ref.parameters():  # norms too: a 1+w vs w confusion must show
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    ours = load_dflash(DFlashConfig.from_hf(d), ref.state_dict(), torch.float32, "cpu")
    return ref, ours


@pytest.mark.parametrize(
    ("layer_types", "ids", "window"),
    [
        (None, None, False),
        (["sliding_attention", "full_attention"], [0, 3, 6], False),
        (["full_attention", "sliding_attention"], None, True),
    ],
)
def test_draft_hidden_and_logits_equal_the_reference(layer_types, ids, window: bool) -> None:
    d = _hf_config(layer_types, ids, window)
    ref, ours = _pair(d)
    n_ids = len(ours.cfg.target_layer_ids)
    assert list(ours.cfg.target_layer_ids) == list(ref.target_layer_ids)
    ctx_len, block = 11, 6
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(1, ctx_len, n_ids * H, generator=g)  # [1, C, L*H]
    noise = torch.randn(1, block, H, generator=g)  # [1, T, H]
    pos = torch.arange(ctx_len + block)[None]  # [1, C+T]
    with torch.no_grad():
        want = ref(position_ids=pos, noise_embedding=noise, target_hidden=feats)  # [1, T, H]
        ctx = ours.context_kv(feats, pos[:, :ctx_len])
        got = ours(noise, pos[:, ctx_len:], ctx, pos[:, :ctx_len], torch.ones(1, ctx_len, dtype=torch.bool))
        head = torch.nn.Linear(H, 64, bias=False)
        want_logits, got_logits = ref.compute_logits(want, head), ours.logits(got, head)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (got - want).abs().max()
    assert torch.allclose(got_logits, want_logits, rtol=1e-4, atol=1e-4)


def test_padded_context_rows_change_nothing() -> None:
    """A batch row with a shorter context (padding keys masked) equals that row alone."""
    _, ours = _pair(_hf_config())
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(2, 9, 2 * H, generator=g)
    noise = torch.randn(2, 4, H, generator=g)
    cpos = torch.stack([torch.arange(9), torch.arange(9)])
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, 6:] = False
    bpos = torch.stack([torch.arange(9, 13), torch.arange(6, 10)])
    with torch.no_grad():
        both = ours(noise, bpos, ours.context_kv(feats, cpos), cpos, valid)
        alone = ours(
            noise[1:], bpos[1:], ours.context_kv(feats[1:, :6], cpos[1:, :6]), cpos[1:, :6], valid[1:, :6]
        )
    # the batch of two sums in another order than the row alone (9 masked keys against 6)
    assert torch.allclose(both[1:], alone, **reorder_tolerance(alone, longest_reduction(ours, 9)))


@pytest.mark.parametrize(("n", "m"), [(36, 5), (40, 5), (64, 5), (8, 1), (8, 3)])
def test_default_target_layers_match_the_reference(n: int, m: int) -> None:
    assert list(default_target_layers(n, m)) == list(build_target_layer_ids(n, m))
