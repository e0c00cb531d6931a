"""Registry: known identities, recognition by shapes + template, sampler presets from the model cards."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.artifact import registry
from ninfer.model.config import TextConfig
from ninfer.templates import read_template

# Model-card recommendations (Qwen3.5/3.6/3.8 cards), written out here rather than read back.
THINK_27B = dict(temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, presence_penalty=0.0)
NO_THINK = dict(temperature=0.7, top_p=0.80, top_k=20, min_p=0.0, presence_penalty=1.5)
THINK_35B = dict(temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, presence_penalty=1.5)
OFF = dict(frequency_penalty=0.0, repetition_penalty=1.0)

# text_config of the released checkpoints
HF_27B: dict[str, Any] = {
    "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120, "num_hidden_layers": 64,
    "intermediate_size": 17408, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "full_attention_interval": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": True},
}  # fmt: skip
HF_35B: dict[str, Any] = {
    **{k: v for k, v in HF_27B.items() if k != "intermediate_size"},
    "model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40,
    "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_value_heads": 32,
    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
}  # fmt: skip


def vl(text: dict[str, Any]) -> dict[str, Any]:
    return {"model_type": text["model_type"].removesuffix("_text"), "text_config": text}


@pytest.mark.parametrize(
    ("model_id", "think", "family"),
    [
        ("qwen3.5-27b", THINK_27B, "qwen3_5"),
        ("qwen3.6-27b", THINK_27B, "qwen3_5"),
        ("qwen3.8-27b", THINK_27B, "qwen3_5"),
        ("qwen3.5-35b-a3b", THINK_35B, "qwen3_5_moe"),
        ("qwen3.6-35b-a3b", THINK_35B, "qwen3_5_moe"),
        ("ninfer-demo", THINK_27B, "qwen3_5"),
        ("some-finetune", THINK_27B, "qwen3_5"),
        ("some-moe-finetune", THINK_27B, "qwen3_5_moe"),
    ],
)
def test_sampler_presets(model_id: str, think: dict[str, float], family: str) -> None:
    assert registry.sampler_preset(model_id, family, thinking=True) == {**think, **OFF}
    assert registry.sampler_preset(model_id, family, thinking=False) == {**NO_THINK, **OFF}
    preset = registry.sampler_preset(model_id, family, thinking=True)
    preset["temperature"] = 9.0  # a fresh dict each call
    assert registry.sampler_preset(model_id, family, thinking=True)["temperature"] == 1.0


def test_unknown_family_preset_raises() -> None:
    with pytest.raises(ValueError, match="unknown model family"):
        registry.sampler_preset("x", "llama", thinking=True)


def test_lookup() -> None:
    ident = registry.lookup("Qwen3.6-35B-A3B")
    assert ident is not None and ident.family == "qwen3_5_moe" and ident.template == "qwen3_6"
    assert ident.display_name == "Qwen3.6-35B-A3B"
    assert registry.lookup("qwen3.8-27b").template == "qwen3_8"  # type: ignore[union-attr]
    assert registry.lookup("nope") is None
    assert {i.model_id for i in registry.KNOWN} == {
        "qwen3.5-27b", "qwen3.5-35b-a3b", "qwen3.6-27b", "qwen3.6-35b-a3b", "qwen3.8-27b", "ninfer-demo",
    }  # fmt: skip


@pytest.mark.parametrize("hf", [HF_27B, vl(HF_27B)])
def test_recognize_27b_needs_the_template(hf: dict[str, Any]) -> None:
    cfg = TextConfig.from_hf(hf)
    assert registry.recognize(cfg) is None  # 3.5, 3.6 and 3.8 share the shapes
    for template, want in (
        ("qwen3_5", "qwen3.5-27b"),
        ("qwen3_6", "qwen3.6-27b"),
        ("qwen3_8", "qwen3.8-27b"),
    ):
        ident = registry.recognize(cfg, template=read_template(template))
        assert ident is not None and ident.model_id == want
    assert registry.recognize(cfg, template="{{ messages }}") is None


def test_recognize_35b() -> None:
    cfg = TextConfig.from_hf(vl(HF_35B))
    assert registry.recognize(cfg) is None
    ident = registry.recognize(cfg, template=read_template("qwen3_6"))
    assert ident is not None and ident.model_id == "qwen3.6-35b-a3b"
    smaller = TextConfig.from_hf({**HF_35B, "num_hidden_layers": 4, "full_attention_interval": 4})
    assert registry.recognize(smaller, template=read_template("qwen3_6")) is None
