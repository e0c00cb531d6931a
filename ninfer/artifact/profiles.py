"""Weight profiles: which format each text / MTP tensor of an artifact is stored in.

`bf16` keeps every tensor dense (as converted today). `groupwise-int` is the seed system's
per-tensor recipe (its `qwen3.6-27b` and `qwen3.6-35b-a3b` artifact references), chosen by the
family: dense models (27B) Q4 for attention query / key, GDN q / k and the MLP's gate / up, Q5 for
attention gate / value / output, GDN v / z / output and the MLP's down, Q6 for the embedding and the
output head (W8 on Qwen3.8), W8 for every MTP matrix; MoE models (35B-A3B) W8 for the embedding,
attention, GDN and shared-expert matrices, Q4 for the routed experts' gate / up, Q5 for their down
(Q6 on layers 34, 38 and 39), Q6 for the output head, W8 for every MTP matrix (its experts too).
Norms, the GDN conv / A_log / dt_bias / a and b projections, the router and the shared-expert gate
stay dense in every profile. `fp8`: e4m3 with 128 x 128 block scales for every matrix but the
embedding (and the dense ones above); the MTP head stays bf16, as in Qwen's FP8 checkpoints. One
format name (`q4_g64`, `q5_g64`, `q6_g64`, `q8_g32`) stores every matrix in that format.

Where the recipe gives a projection's rows two formats (27B attention: query Q4, gate Q5; GDN:
q / k Q4, v Q5), the artifact stores the parts (`ninfer.model.quantized.split_rows`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ninfer.formats.registry import FORMATS, Q4, Q5, Q6, W8
from ninfer.model.config import TextConfig
from ninfer.model.layout import SPLITS, split_parts

SINGLE = tuple(n for n, f in FORMATS.items() if f.kind == "groupwise")
PROFILES = ("bf16", "groupwise-int", "fp8", *SINGLE)
MOE_DOWN_Q6_LAYERS = frozenset({34, 38, 39})  # the 35B-A3B recipe's routed down in Q6

_LAYER = re.compile(r"\.layers\.(\d+)\.")

# suffix -> role; the first match wins
_ROLES: tuple[tuple[str, str], ...] = (
    ("embed_tokens.weight", "embed"),
    ("lm_head.weight", "head"),
    ("self_attn.query_proj.weight", "attn_query"),
    ("self_attn.gate_proj.weight", "attn_gate"),
    ("self_attn.k_proj.weight", "attn_key"),
    ("self_attn.v_proj.weight", "attn_value"),
    ("self_attn.o_proj.weight", "attn_output"),
    ("linear_attn.in_proj_qk.weight", "gdn_qk"),
    ("linear_attn.in_proj_v.weight", "gdn_v"),
    ("linear_attn.in_proj_z.weight", "gdn_z"),
    ("linear_attn.in_proj_a.weight", "gdn_ab"),
    ("linear_attn.in_proj_b.weight", "gdn_ab"),
    ("linear_attn.out_proj.weight", "gdn_output"),
    ("mlp.shared_expert_gate.weight", "shared_gate"),
    ("mlp.shared_expert.down_proj.weight", "shared_down"),
    ("mlp.shared_expert.gate_proj.weight", "shared_in"),
    ("mlp.shared_expert.up_proj.weight", "shared_in"),
    ("mlp.experts.gate_up_proj", "experts_in"),
    ("mlp.experts.down_proj", "experts_down"),
    ("mlp.gate.weight", "router"),
    ("mlp.gate_proj.weight", "mlp_in"),
    ("mlp.up_proj.weight", "mlp_in"),
    ("mlp.down_proj.weight", "mlp_down"),
    ("mtp.fc.weight", "mtp_fc"),
)
DENSE_ROLES = frozenset({"router", "shared_gate", "gdn_ab"})  # dense in every profile

_DENSE_27B = {
    "embed": Q6, "head": Q6,
    "attn_query": Q4, "attn_key": Q4, "attn_gate": Q5, "attn_value": Q5, "attn_output": Q5,
    "gdn_qk": Q4, "gdn_v": Q5, "gdn_z": Q5, "gdn_output": Q5,
    "mlp_in": Q4, "mlp_down": Q5,
}  # fmt: skip
_MOE_35B = {
    "embed": W8, "head": Q6,
    "attn_query": W8, "attn_key": W8, "attn_gate": W8, "attn_value": W8, "attn_output": W8,
    "gdn_qk": W8, "gdn_v": W8, "gdn_z": W8, "gdn_output": W8,
    "shared_in": W8, "shared_down": W8, "experts_in": Q4, "experts_down": Q5,
}  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """How one logical tensor of the artifact is stored: its name and shape, its format (None:
    dense), and the whole it was cut from when it is a part of a split projection."""

    name: str
    shape: tuple[int, ...]
    fmt: str | None
    whole: str | None = None


def role(name: str) -> str | None:
    """The recipe role of a canonical tensor name (None: a norm, conv, A_log, dt_bias: always dense)."""
    for suffix, r in _ROLES:
        if name.endswith(suffix):
            return r
    return None


def check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"unknown weight profile {profile!r}; choose one of {', '.join(PROFILES)}")


def format_for(profile: str, config: TextConfig, model_id: str, name: str) -> str | None:
    """The format `profile` stores tensor `name` in (after any split), or None for dense."""
    check_profile(profile)
    r = role(name)
    if profile == "bf16" or r is None or r in DENSE_ROLES:
        return None
    mtp = name.startswith("mtp.")
    if profile in SINGLE:
        return profile
    if profile == "fp8":
        return None if mtp or r == "embed" else "fp8_e4m3_b128"
    if mtp:
        return W8.name
    if config.is_moe:
        if r == "experts_down":
            m = _LAYER.search(name)
            if m and int(m[1]) in MOE_DOWN_Q6_LAYERS:
                return Q6.name
        fmt = _MOE_35B.get(r)
    else:
        fmt = _DENSE_27B.get(r)
        if r in ("embed", "head") and "qwen3.8" in model_id.lower():
            fmt = W8
    return None if fmt is None else fmt.name


def plan(profile: str, config: TextConfig, model_id: str, name: str, shape: tuple[int, ...]) -> list[Plan]:
    """How canonical tensor `name` of `shape` is stored under `profile`: itself, or its parts when
    the recipe gives the parts two formats."""
    for whole, parts in SPLITS:
        if name.endswith(whole):
            prefix = name.removesuffix(whole)
            fmts = [format_for(profile, config, model_id, prefix + p) for p in parts]
            if fmts[0] == fmts[1]:
                return [Plan(name, shape, fmts[0])]
            rows = split_parts(config, name)
            assert rows is not None
            return [
                Plan(n, (r, shape[1]), f, whole=name) for (n, r), f in zip(rows.items(), fmts, strict=True)
            ]
    return [Plan(name, shape, format_for(profile, config, model_id, name))]
