"""The model configuration: one frozen dataclass read from an artifact or a Hugging Face config."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

PAGE_SIZE = 64  # tokens per KV page: the pool, the engine's allocator and the settings count in these

DENSE = "qwen3_5"
MOE = "qwen3_5_moe"
FAMILIES = (DENSE, MOE)

LINEAR = "linear_attention"
FULL = "full_attention"

# The text model types Hugging Face uses for each family (VL configs nest these under text_config).
_HF_TEXT_TYPES = {
    "qwen3_5": DENSE,
    "qwen3_5_text": DENSE,
    "qwen3_5_moe": MOE,
    "qwen3_5_moe_text": MOE,
}


class UnknownArchitectureError(ValueError):
    """The checkpoint is not a Qwen3.5-family model this project can run."""


@dataclass(frozen=True)
class TextConfig:
    """Shapes and constants of the hybrid GDN + gated-attention text model."""

    family: str  # DENSE or MOE
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = (11, 11, 10)
    mrope_interleaved: bool = True
    rope_scaling: dict[str, Any] | None = None  # e.g. yarn parameters; None = default rope
    max_position_embeddings: int = 262_144
    # dense FFN
    intermediate_size: int | None = None
    # MoE FFN
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    # MTP head
    mtp_num_hidden_layers: int = 0
    # stop / special ids
    eos_token_ids: tuple[int, ...] = (248046, 248044)
    image_token_id: int = 248056
    video_token_id: int = 248057
    vision_start_token_id: int = 248053
    vision_end_token_id: int = 248054
    # the vision tower's Hugging Face config, when the checkpoint carries one
    vision: dict[str, Any] | None = field(default=None, compare=False)

    # ----- derived quantities -----
    @property
    def is_moe(self) -> bool:
        return self.family == MOE

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def key_dim(self) -> int:  # nk * dk
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:  # nv * dv
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:  # channels of the causal conv: [q | k | v]
        return 2 * self.key_dim + self.value_dim

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    # ----- (de)serialisation -----
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TextConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        kw = dict(d)
        for k in ("layer_types", "mrope_section", "eos_token_ids"):
            if k in kw and kw[k] is not None:
                kw[k] = tuple(kw[k])
        cfg = cls(**kw)
        cfg.validate()
        return cfg

    @classmethod
    def from_hf(cls, hf: dict[str, Any], generation_config: dict[str, Any] | None = None) -> TextConfig:
        """Build from a Hugging Face `config.json` (VL with `text_config`, or text-only)."""
        top_type = hf.get("model_type")
        text = hf.get("text_config") or hf
        ttype = text.get("model_type", top_type)
        family = _HF_TEXT_TYPES.get(ttype) or _HF_TEXT_TYPES.get(top_type or "")
        if family is None:
            archs = hf.get("architectures")
            raise UnknownArchitectureError(
                f"unsupported architecture model_type={top_type!r} architectures={archs!r}; "
                f"known model types: {sorted(_HF_TEXT_TYPES)}"
            )
        n_layers = int(text["num_hidden_layers"])
        layer_types = text.get("layer_types")
        if not layer_types:
            interval = int(text.get("full_attention_interval", 4))
            layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers)]
        rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
        rope_theta = float(rope.get("rope_theta", text.get("rope_theta", 10_000.0)))
        prf = float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)))
        mrope_section = tuple(rope.get("mrope_section") or (11, 11, 10))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_scaling = None
        if rope_type not in (None, "default"):
            rope_scaling = {
                k: v
                for k, v in rope.items()
                if k not in ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")
            }
        eos: list[int] = []
        for src in (generation_config or {}, hf, text):
            e = src.get("eos_token_id")
            for x in [e] if isinstance(e, int) else (e or []):
                if x not in eos:
                    eos.append(int(x))
        for x in (248046, 248044):  # the Qwen family stops on both <|im_end|> and <|endoftext|>
            if x not in eos:
                eos.append(x)
        kw: dict[str, Any] = dict(
            family=family,
            vocab_size=int(text["vocab_size"]),
            hidden_size=int(text["hidden_size"]),
            num_hidden_layers=n_layers,
            layer_types=tuple(layer_types),
            num_attention_heads=int(text["num_attention_heads"]),
            num_key_value_heads=int(text["num_key_value_heads"]),
            head_dim=int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]),
            linear_num_key_heads=int(text["linear_num_key_heads"]),
            linear_num_value_heads=int(text["linear_num_value_heads"]),
            linear_key_head_dim=int(text["linear_key_head_dim"]),
            linear_value_head_dim=int(text["linear_value_head_dim"]),
            linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            partial_rotary_factor=prf,
            mrope_section=mrope_section,
            mrope_interleaved=bool(rope.get("mrope_interleaved", True)),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(text.get("max_position_embeddings", 262_144)),
            mtp_num_hidden_layers=int(text.get("mtp_num_hidden_layers", 0) or 0),
            eos_token_ids=tuple(eos),
            image_token_id=int(hf.get("image_token_id", 248056)),
            video_token_id=int(hf.get("video_token_id", 248057)),
            vision_start_token_id=int(hf.get("vision_start_token_id", 248053)),
            vision_end_token_id=int(hf.get("vision_end_token_id", 248054)),
            vision=hf.get("vision_config"),
        )
        if family == DENSE:
            kw["intermediate_size"] = int(text["intermediate_size"])
        else:
            kw.update(
                num_experts=int(text["num_experts"]),
                num_experts_per_tok=int(text["num_experts_per_tok"]),
                moe_intermediate_size=int(text["moe_intermediate_size"]),
                shared_expert_intermediate_size=int(text["shared_expert_intermediate_size"]),
            )
        cfg = cls(**kw)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.family not in FAMILIES:
            raise UnknownArchitectureError(f"unknown family {self.family!r}; known: {FAMILIES}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError("layer_types must have one entry per layer")
        if set(self.layer_types) - {LINEAR, FULL}:
            raise ValueError(f"unknown layer types {set(self.layer_types) - {LINEAR, FULL}}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if sum(self.mrope_section) * 2 != self.rotary_dim:
            raise ValueError(
                f"mrope_section {self.mrope_section} must sum to rotary_dim/2 = {self.rotary_dim // 2}"
            )
        if self.family == DENSE and not self.intermediate_size:
            raise ValueError("dense family needs intermediate_size")
        if self.family == MOE and not (self.num_experts and self.num_experts_per_tok):
            raise ValueError("MoE family needs num_experts and num_experts_per_tok")
