"""Tiny random transformers Qwen3.5 VL models (dense / MoE) with every parameter randomised."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3_5Config, Qwen3_5MoeConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForConditionalGeneration

TEXT_HIDDEN = 64
VISION: dict[str, Any] = dict(
    depth=2,
    hidden_size=32,
    intermediate_size=48,
    num_heads=2,
    out_hidden_size=TEXT_HIDDEN,
    patch_size=16,
    temporal_patch_size=2,
    spatial_merge_size=2,
    num_position_embeddings=64,
)


def _text(kind: str) -> dict[str, Any]:
    text: dict[str, Any] = dict(
        vocab_size=512,
        hidden_size=TEXT_HIDDEN,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
    )
    if kind == "dense":
        text["intermediate_size"] = 96
    else:
        text.update(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32
        )
    return text


def hf_vl_model(kind: str = "dense", seed: int = 0, **top: Any) -> torch.nn.Module:
    """`Qwen3_5(Moe)ForConditionalGeneration` with random weights (LayerNorm affine terms included);
    `top` overrides top-level config fields (e.g. the media token ids)."""
    cls_cfg, cls = (
        (Qwen3_5Config, Qwen3_5ForConditionalGeneration)
        if kind == "dense"
        else (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration)
    )
    cfg = cls_cfg(text_config=_text(kind), vision_config=dict(VISION), tie_word_embeddings=False, **top)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("model.visual."):
                fan_in = p[0].numel() if p.ndim > 1 else 1
                scale = 1.0 / fan_in**0.5 if p.ndim > 1 else 0.2
                base = 1.0 if name.endswith("weight") and "norm" in name else 0.0
                p.copy_(base + torch.randn_like(p) * scale)
    return model


def visual_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Canonical `visual.*` tensors (the artifact renames `model.visual.*`)."""
    return {
        k[len("model.") :]: v.detach().clone()
        for k, v in model.state_dict().items()
        if k.startswith("model.visual.")
    }
