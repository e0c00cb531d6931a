"""Text-config shapes of the released checkpoints (Hugging Face `text_config` form).

Used to build artifacts of the real layer shapes without weight files (`synth`) and by the GPU
benchmarks. Values from the released configs: 27B dense (64 layers, every fourth gated attention)
and 35B-A3B MoE (40 layers, 256 experts top-8); both carry one MTP layer.
"""

from __future__ import annotations

from typing import Any

COMMON: dict[str, Any] = dict(
    vocab_size=248320,
    head_dim=256,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    max_position_embeddings=262144,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10_000_000,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
)

RELEASED_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3.6-27b": dict(
        COMMON,
        model_type="qwen3_5_text",
        hidden_size=5120,
        num_hidden_layers=64,
        intermediate_size=17408,
        num_attention_heads=24,
        num_key_value_heads=4,
        linear_num_key_heads=16,
        linear_num_value_heads=48,
    ),
    "qwen3.6-35b-a3b": dict(
        COMMON,
        model_type="qwen3_5_moe_text",
        hidden_size=2048,
        num_hidden_layers=40,
        num_attention_heads=16,
        num_key_value_heads=2,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
    ),
}

# The released generation configs' stop ids (the same for every member of the family).
RELEASED_GENERATION: dict[str, Any] = {
    "bos_token_id": 248044,
    "eos_token_id": [248046, 248044],
    "pad_token_id": 248044,
}
