"""Known model identities: recognition by shapes (+ template), display names and sampler presets."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from ninfer.model.config import DENSE, MOE, TextConfig

Preset = dict[str, float | int]

# Qwen model-card recommendations. Frequency penalty 0 and repetition penalty 1 (off) everywhere.
_THINK = {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "presence_penalty": 0.0}
_NO_THINK = {"temperature": 0.7, "top_p": 0.80, "top_k": 20, "min_p": 0.0, "presence_penalty": 1.5}
_THINK_MOE = {**_THINK, "presence_penalty": 1.5}  # the 35B-A3B cards differ only here
_NEUTRAL = {"frequency_penalty": 0.0, "repetition_penalty": 1.0}

_SHAPES_27B = {
    "hidden_size": 5120, "num_hidden_layers": 64, "intermediate_size": 17408,
    "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "vocab_size": 248320,
}  # fmt: skip
_SHAPES_35B_A3B = {
    "hidden_size": 2048, "num_hidden_layers": 40, "num_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "vocab_size": 248320,
}  # fmt: skip


@dataclass(frozen=True)
class Identity:
    """One known model: what it is called, how to recognise it, how to sample from it."""

    model_id: str
    family: str
    display_name: str
    template: str  # name for ninfer.templates.read_template
    thinking: Preset
    non_thinking: Preset
    shapes: dict[str, int] = field(
        default_factory=dict
    )  # TextConfig fields that identify it; {} = never recognised


def _ident(
    model_id: str,
    family: str,
    display: str,
    template: str,
    shapes: dict[str, int],
    think: Preset | None = None,
) -> Identity:
    think = think or (_THINK_MOE if family == MOE else _THINK)
    return Identity(
        model_id=model_id,
        family=family,
        display_name=display,
        template=template,
        thinking={**think, **_NEUTRAL},
        non_thinking={**_NO_THINK, **_NEUTRAL},
        shapes=shapes,
    )


DEMO_ID = "ninfer-demo"

KNOWN: tuple[Identity, ...] = (
    _ident("qwen3.5-27b", DENSE, "Qwen3.5-27B", "qwen3_5", _SHAPES_27B),
    _ident("qwen3.5-35b-a3b", MOE, "Qwen3.5-35B-A3B", "qwen3_5", _SHAPES_35B_A3B),
    _ident("qwen3.6-27b", DENSE, "Qwen3.6-27B", "qwen3_6", _SHAPES_27B),
    _ident("qwen3.6-35b-a3b", MOE, "Qwen3.6-35B-A3B", "qwen3_6", _SHAPES_35B_A3B),
    _ident("qwen3.8-27b", DENSE, "Qwen3.8-27B", "qwen3_8", _SHAPES_27B),
    _ident(DEMO_ID, DENSE, "NInfer demo (random weights)", "qwen3_6", {}),
)

# Presets for ids the registry does not know: the 27B values for both families.
FAMILY_DEFAULTS: dict[str, Identity] = {
    DENSE: _ident("", DENSE, "", "qwen3_6", {}),
    MOE: _ident("", MOE, "", "qwen3_6", {}, think=_THINK),
}


def lookup(model_id: str) -> Identity | None:
    """The known identity with this id (case-insensitive), or None."""
    key = model_id.lower()
    return next((i for i in KNOWN if i.model_id == key), None)


@cache
def _official_template(name: str) -> str:
    from ninfer.templates import read_template

    return read_template(name)


def recognize(config: TextConfig, template: str | None = None) -> Identity | None:
    """The known identity whose shapes the config has; None when none or several match.

    Same-size releases share shapes (Qwen3.5/3.6/3.8-27B), so pass the checkpoint's chat
    template to tell them apart: it must then equal that identity's official template exactly.
    """
    found = [
        i
        for i in KNOWN
        if i.shapes
        and i.family == config.family
        and all(getattr(config, k) == v for k, v in i.shapes.items())
    ]
    if template is not None:
        found = [i for i in found if _official_template(i.template) == template]
    return found[0] if len(found) == 1 else None


def sampler_preset(model_id: str, family: str, thinking: bool) -> Preset:
    """Default sampling values for a model id in thinking or non-thinking mode (a fresh dict)."""
    ident = lookup(model_id) or FAMILY_DEFAULTS.get(family)
    if ident is None:
        raise ValueError(f"unknown model family {family!r}; known: {sorted(FAMILY_DEFAULTS)}")
    return dict(ident.thinking if thinking else ident.non_thinking)
