"""What the seed system's container objects mean for our model: its logical parameter names, how a
v2 file's fused parents split into them, and which of our canonical tensors each one becomes.

The seed stores matrices that read one input as one parent (per its model artifact references):
attention `query_key` = [query, key] and `gate_value` = [output gate, value] (the 27B groupwise
contract), or `query_key_gate_value` (MTP, the 35B-A3B, single-format contracts); GDN `query_key`
= [q, k] and `value_z` = [v, z], or `query_key_value_z`; GDN `a_b_projection` = [a, b]; MLP
`gate_up` = [gate, up]; MoE `router_shared_gate` = [router, shared-expert gate], `routed_gate_up`
= per expert [gate, up] rows, `routed_down` per expert rows, `shared_gate_up` = [gate, up]. v3 files
carry these splits themselves as `bindings` (element ranges of the parents); for a v2 file
`v2_bindings` derives the same logical names from the object names and the model geometry.

Our side (`targets`): the query / gate halves are our `query_proj` / `gate_proj` (the split form a
quantized artifact of ours also stores), GDN [q, k] is `in_proj_qk`, v `in_proj_v`, z `in_proj_z`;
the routed experts of one layer are one bank `[E, 2I, H]` / `[E, H, I]` whose rows are exactly the
parent's rows, so a groupwise bank is a reshape of the parent's planes (no copy). The GDN convolution
is stored tap-major `[4, C]` and becomes our `[C, 1, 4]` (a transposing copy of a small tensor).
The vision tower (`vision_targets`): the patch projection `[H, C*T*P*P]` is our Conv3d weight by
reshape, `attention/{query,key,value}` (+ `_bias`) our fused `qkv`, `norm1_weight` our `norm1.weight`
(v2 stores `attention/qkv` and `norm1/weight`: `v2_bindings` gives them the v3 names)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ninfer.artifact.seed_container import Part, SeedFile, SeedFormatError
from ninfer.model.config import FULL, TextConfig

# HF-style text configs of the model ids the seed registers for v2 files (no config inside them);
# geometry from its `qwen3.6-27b-artifact.md` / `qwen3.6-35b-a3b-artifact.md` fact tables
_ROPE = {"rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]}
_DENSE_27B: dict[str, Any] = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 5120,
    "vocab_size": 248320, "tie_word_embeddings": False, "num_hidden_layers": 64,
    "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(64)],
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "num_attention_heads": 24,
    "num_key_value_heads": 4, "head_dim": 256, "rope_parameters": _ROPE, "linear_num_key_heads": 16,
    "linear_key_head_dim": 128, "linear_num_value_heads": 48, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "intermediate_size": 17408,
}  # fmt: skip
_MOE_35B: dict[str, Any] = {
    **{k: v for k, v in _DENSE_27B.items() if k != "intermediate_size"},
    "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "hidden_size": 2048,
    "num_hidden_layers": 40,
    "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(40)],
    "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_value_heads": 32,
    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
}  # fmt: skip
V2_MODELS: dict[str, dict[str, Any]] = {
    "qwen3.6-27b": _DENSE_27B,
    "qwen3.8-27b": _DENSE_27B,
    "qwen3.6-35b-a3b": _MOE_35B,
}
# the vision towers of the registered ids (v2 files carry no config; the upgrade tool's values)
_VISION = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "patch_size": 16,
           "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 2304}  # fmt: skip
V2_VISION: dict[str, dict[str, Any]] = {
    "qwen3.6-27b": {"model_type": "qwen3_5_vision", **_VISION},
    "qwen3.8-27b": {"model_type": "qwen3_5_vision", **_VISION},
    "qwen3.6-35b-a3b": {"model_type": "qwen3_5_moe_vision", **_VISION},
}
# logical names of components we do not load (listed by `inspect`); vision/ is loaded when asked for,
# dflash/ when its config is established (`seed_dflash`), proposal/ when it is an indexed head
# (`proposal_targets`): a proposal over the full vocabulary is the output head itself, which every
# speculative round already uses; dflash2/ (DFlash 2) is never loaded
NOT_LOADED = ("vision/", "dflash/", "dflash2/", "proposal/")
PROPOSAL_HEAD, PROPOSAL_IDS = "proposal/head", "proposal/token_ids"


@dataclass(frozen=True)
class Target:
    """One canonical tensor of ours: its component, name and shape, the seed logical parameters whose
    elements it concatenates (in order), and a transform ("" or "conv": tap-major [4, C] -> [C, 1, 4])."""

    component: str
    name: str
    shape: tuple[int, ...]
    sources: tuple[tuple[str, tuple[int, ...]], ...]  # (logical name, its shape)
    transform: str = ""


def _block_targets(c: TextConfig, comp: str, ours: str, seed: str, full: bool) -> list[Target]:
    h, hd = c.hidden_size, c.head_dim
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    out: list[Target] = []

    def t(name: str, shape: tuple[int, ...], *src: tuple[str, tuple[int, ...]], transform: str = "") -> None:
        out.append(Target(comp, ours + name, shape, tuple((seed + s, sh) for s, sh in src), transform))

    t("input_layernorm.weight", (h,), ("input_norm", (h,)))
    t("post_attention_layernorm.weight", (h,), ("post_attention_norm", (h,)))
    if full:
        a = "self_attn."
        t(a + "query_proj.weight", (q, h), ("attention/query", (q, h)))
        t(a + "gate_proj.weight", (q, h), ("attention/gate", (q, h)))
        t(a + "k_proj.weight", (kv, h), ("attention/key", (kv, h)))
        t(a + "v_proj.weight", (kv, h), ("attention/value", (kv, h)))
        t(a + "o_proj.weight", (h, q), ("attention/output", (h, q)))
        t(a + "q_norm.weight", (hd,), ("attention/query_norm", (hd,)))
        t(a + "k_norm.weight", (hd,), ("attention/key_norm", (hd,)))
    else:
        g, kd, vd, nv = "linear_attn.", c.key_dim, c.value_dim, c.linear_num_value_heads
        t(g + "in_proj_qk.weight", (2 * kd, h), ("gdn/query", (kd, h)), ("gdn/key", (kd, h)))
        t(g + "in_proj_v.weight", (vd, h), ("gdn/value", (vd, h)))
        t(g + "in_proj_z.weight", (vd, h), ("gdn/z", (vd, h)))
        t(g + "in_proj_a.weight", (nv, h), ("gdn/a_projection", (nv, h)))
        t(g + "in_proj_b.weight", (nv, h), ("gdn/b_projection", (nv, h)))
        taps = c.linear_conv_kernel_dim
        t(
            g + "conv1d.weight",
            (c.conv_dim, 1, taps),
            ("gdn/convolution", (taps, c.conv_dim)),
            transform="conv",
        )
        t(g + "dt_bias", (nv,), ("gdn/dt_bias", (nv,)))
        t(g + "A_log", (nv,), ("gdn/a_log", (nv,)))
        t(g + "norm.weight", (c.linear_value_head_dim,), ("gdn/norm", (c.linear_value_head_dim,)))
        t(g + "out_proj.weight", (h, vd), ("gdn/output", (h, vd)))
    if not c.is_moe:
        i = int(c.intermediate_size or 0)
        t("mlp.gate_proj.weight", (i, h), ("mlp/gate", (i, h)))
        t("mlp.up_proj.weight", (i, h), ("mlp/up", (i, h)))
        t("mlp.down_proj.weight", (h, i), ("mlp/down", (h, i)))
        return out
    e, ie, s = (
        int(c.num_experts or 0),
        int(c.moe_intermediate_size or 0),
        int(c.shared_expert_intermediate_size or 0),
    )
    t("mlp.gate.weight", (e, h), ("moe/router", (e, h)))
    t("mlp.shared_expert_gate.weight", (1, h), ("moe/shared_score", (1, h)))
    gate_up = [(f"moe/experts/{x}/{p}", (ie, h)) for x in range(e) for p in ("gate", "up")]
    t("mlp.experts.gate_up_proj", (e, 2 * ie, h), *gate_up)
    t("mlp.experts.down_proj", (e, h, ie), *[(f"moe/experts/{x}/down", (h, ie)) for x in range(e)])
    t("mlp.shared_expert.gate_proj.weight", (s, h), ("moe/shared/gate", (s, h)))
    t("mlp.shared_expert.up_proj.weight", (s, h), ("moe/shared/up", (s, h)))
    t("mlp.shared_expert.down_proj.weight", (h, s), ("moe/shared/down", (h, s)))
    return out


def vision_targets(v: dict[str, Any], out_hidden: int) -> list[Target]:
    """Our `visual.*` tensors (component `vision`) from the seed's vision names: the patch projection
    stored `[H, C*T*P*P]` is our Conv3d weight by reshape, [query ; key ; value] our fused qkv."""
    h, i, n = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_position_embeddings"])
    t_, p_, c_ = int(v.get("temporal_patch_size", 2)), int(v["patch_size"]), int(v.get("in_channels", 3))
    wide = h * int(v.get("spatial_merge_size", 2)) ** 2
    out: list[Target] = []

    def t(name: str, shape: tuple[int, ...], *src: tuple[str, tuple[int, ...]]) -> None:
        out.append(Target("vision", "visual." + name, shape, tuple(("vision/" + a, b) for a, b in src)))

    t("patch_embed.proj.weight", (h, c_, t_, p_, p_), ("patch_embedding", (h, c_ * t_ * p_ * p_)))
    t("patch_embed.proj.bias", (h,), ("patch_embedding_bias", (h,)))
    t("pos_embed.weight", (n, h), ("position_embedding", (n, h)))
    for b in range(int(v["depth"])):
        ours, seed = f"blocks.{b}.", f"layers/{b}/"
        qkv = ("query", "key", "value")
        t(ours + "attn.qkv.weight", (3 * h, h), *[(f"{seed}attention/{r}", (h, h)) for r in qkv])
        t(ours + "attn.qkv.bias", (3 * h,), *[(f"{seed}attention/{r}_bias", (h,)) for r in qkv])
        for o, s_, shape in (
            ("attn.proj", "attention/output", (h, h)),
            ("mlp.linear_fc1", "mlp/fc1", (i, h)),
            ("mlp.linear_fc2", "mlp/fc2", (h, i)),
        ):
            t(ours + o + ".weight", shape, (seed + s_, shape))
            t(ours + o + ".bias", shape[:1], (seed + s_ + "_bias", shape[:1]))
        for norm in ("norm1", "norm2"):
            t(f"{ours}{norm}.weight", (h,), (f"{seed}{norm}_weight", (h,)))
            t(f"{ours}{norm}.bias", (h,), (f"{seed}{norm}_bias", (h,)))
    for o, shape in (("linear_fc1", (wide, wide)), ("linear_fc2", (out_hidden, wide))):
        s_ = "merger/" + o.removeprefix("linear_")
        t(f"merger.{o}.weight", shape, (s_, shape))
        t(f"merger.{o}.bias", shape[:1], (s_ + "_bias", shape[:1]))
    t("merger.norm.weight", (h,), ("merger/norm_weight", (h,)))
    t("merger.norm.bias", (h,), ("merger/norm_bias", (h,)))
    return out


def targets(c: TextConfig, mtp: bool) -> list[Target]:
    """Every text (and, with `mtp`, MTP) tensor of ours with the seed logical parameters it is made of."""
    h, v = c.hidden_size, c.vocab_size
    out = [
        Target("text", "model.embed_tokens.weight", (v, h), (("text/token_embedding", (v, h)),)),
        Target("text", "model.norm.weight", (h,), (("text/final_norm", (h,)),)),
        Target("text", "lm_head.weight", (v, h), (("text/output_head", (v, h)),)),
    ]
    for i, kind in enumerate(c.layer_types):
        out += _block_targets(c, "text", f"model.layers.{i}.", f"text/layers/{i}/", kind == FULL)
    if mtp:
        out += [
            Target("mtp", "mtp.fc.weight", (h, 2 * h), (("mtp/input_projection", (h, 2 * h)),)),
            Target("mtp", "mtp.pre_fc_norm_embedding.weight", (h,), (("mtp/embedding_norm", (h,)),)),
            Target("mtp", "mtp.pre_fc_norm_hidden.weight", (h,), (("mtp/hidden_norm", (h,)),)),
            Target("mtp", "mtp.norm.weight", (h,), (("mtp/final_norm", (h,)),)),
        ]
        for i in range(c.mtp_num_hidden_layers):
            out += _block_targets(c, "mtp", f"mtp.layers.{i}.", f"mtp/layers/{i}/", True)
    return out


# ----------------------------------------------------------------------------------------- v2 names
_BLOCK = re.compile(r"(text/layers/(\d+)/|mtp/layer/)(.+)")
_ACT_DIVISOR = "/input_scale_divisor"  # NVFP4 activation scalars: validation-only for a weight-only load


def v2_bindings(sf: SeedFile, c: TextConfig) -> dict[str, tuple[Part, ...]]:
    """The logical parameters of a v2 file: fused parents split by rows into the names v3 uses."""
    h, hd = c.hidden_size, c.head_dim
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    kd, vd, nv = c.key_dim, c.value_dim, c.linear_num_value_heads
    out: dict[str, tuple[Part, ...]] = {}
    splits: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = {
        "attention/query_key": ("attention/", (("query", q), ("key", kv))),
        "attention/gate_value": ("attention/", (("gate", q), ("value", kv))),
        "attention/query_key_gate_value": (
            "attention/",
            (("query", q), ("key", kv), ("gate", q), ("value", kv)),
        ),
        "gdn/query_key": ("gdn/", (("query", kd), ("key", kd))),
        "gdn/value_z": ("gdn/", (("value", vd), ("z", vd))),
        "gdn/query_key_value_z": ("gdn/", (("query", kd), ("key", kd), ("value", vd), ("z", vd))),
        "gdn/a_b_projection": ("gdn/", (("a_projection", nv), ("b_projection", nv))),
        "mlp/gate_up": (
            "mlp/",
            (("gate", int(c.intermediate_size or 0)), ("up", int(c.intermediate_size or 0))),
        ),
        "moe/router_shared_gate": ("moe/", (("router", int(c.num_experts or 0)), ("shared_score", 1))),
        "moe/shared_gate_up": (
            "moe/shared/",
            (
                ("gate", int(c.shared_expert_intermediate_size or 0)),
                ("up", int(c.shared_expert_intermediate_size or 0)),
            ),
        ),
    }
    e, ie = int(c.num_experts or 0), int(c.moe_intermediate_size or 0)
    for obj in sf.objects.values():
        if obj.kind != "tensor" or obj.name.endswith(_ACT_DIVISOR):
            continue
        name = obj.name
        whole = (Part(name, 0, obj.elements),)
        if name.startswith("vision/"):
            out.update(_v2_vision(sf, obj.name, obj.elements))
            continue
        m = _BLOCK.fullmatch(name)
        if m is None:
            if name in ("text/draft_head", "text/draft_head_token_ids"):
                out["proposal/head" if name.endswith("draft_head") else "proposal/token_ids"] = whole
            else:
                out[name] = whole
            continue
        block = "mtp/layers/0/" if m[1] == "mtp/layer/" else m[1]
        role = m[3]
        rows: tuple[tuple[str, int], ...]
        if role in splits:
            prefix, rows = splits[role]
            prefix = block + prefix
        elif role == "moe/routed_gate_up":
            prefix, rows = (
                block + "moe/experts/",
                tuple((f"{x}/{p}", ie) for x in range(e) for p in ("gate", "up")),
            )
        elif role == "moe/shared_down":
            out[block + "moe/shared/down"] = whole
            continue
        elif role == "moe/routed_down":
            prefix, rows = block + "moe/experts/", tuple((f"{x}/down", h) for x in range(e))
        else:
            out[block + role] = whole
            continue
        width = obj.shape[-1] if obj.shape else 1
        total = sum(r for _, r in rows)
        if len(obj.shape) != 2 or obj.shape[0] != total:
            raise SeedFormatError(
                f"{sf.path}: object {name!r}: shape {list(obj.shape)}, the model's fused rows are {total}"
            )
        cursor = 0
        for sub, r in rows:
            out[prefix + sub] = (Part(name, cursor * width, (cursor + r) * width),)
            cursor += r
    return out


def _v2_vision(sf: SeedFile, name: str, n: int) -> dict[str, tuple[Part, ...]]:
    """A v2 vision object's logical names: qkv (and its bias) split in three, `norm*/weight` ->
    `norm*_weight` (the v3 spelling)."""
    if name.endswith(("/attention/qkv", "/attention/qkv_bias")):
        if n % 3:
            raise SeedFormatError(f"{sf.path}: object {name!r}: {n} elements do not split in three")
        base, bias = name.rsplit("/", 1)[0], "_bias" if name.endswith("_bias") else ""
        third = n // 3
        return {
            f"{base}/{r}{bias}": (Part(name, k * third, (k + 1) * third),)
            for k, r in enumerate(("query", "key", "value"))
        }
    logical = re.sub(r"/(norm\d?)/(weight|bias)$", r"/\1_\2", name)
    return {logical: (Part(name, 0, n),)}


def proposal_targets(c: TextConfig, bindings: dict[str, tuple[Part, ...]]) -> list[Target]:
    """The indexed proposal head as our `lm_head_draft` component: row i of `proposal/head` is the
    output-head row of id `proposal/token_ids[i]` (the ids unique, in the file's order; our draft
    head sorts them). None without the id map (a full-vocabulary proposal, or none)."""
    ids = bindings.get(PROPOSAL_IDS)
    if ids is None or PROPOSAL_HEAD not in bindings:
        return []
    rows = sum(p.end - p.begin for p in ids)
    h = c.hidden_size
    return [
        Target("lm_head_draft", "weight", (rows, h), ((PROPOSAL_HEAD, (rows, h)),)),
        Target("lm_head_draft", "token_ids", (rows,), ((PROPOSAL_IDS, (rows,)),)),
    ]


def _check_proposal(sf: SeedFile, found: list[Target]) -> None:
    """v3: the text component's declared proposal and its bindings agree (an indexed head of
    `rows` rows has both `proposal/head` and `proposal/token_ids`, of that many rows)."""
    text = sf.components.get("text") if sf.version >= 3 else None
    if text is None:
        return
    declared = text.proposal if text.proposal is not None and text.proposal["domain"] == "indexed" else None
    if declared is None and found:
        raise SeedFormatError(
            f"{sf.path}: {PROPOSAL_IDS!r} is bound but the text component declares no indexed proposal"
        )
    if declared is not None and (not found or found[1].shape[0] != declared["rows"]):
        have = "no" if not found else f"{found[1].shape[0]} rows of"
        raise SeedFormatError(
            f"{sf.path}: the text component declares an indexed proposal of {declared['rows']} rows, "
            f"the bindings have {have} {PROPOSAL_HEAD!r} / {PROPOSAL_IDS!r}"
        )


def has_mtp(sf: SeedFile, bindings: dict[str, tuple[Part, ...]]) -> bool:
    """Whether the file carries the MTP head (v3: the component; v2: its objects)."""
    if sf.version >= 3:
        return "mtp" in sf.components
    return any(n.startswith("mtp/") for n in bindings)


def has_vision(bindings: dict[str, tuple[Part, ...]]) -> bool:
    """Whether the file carries the vision tower's tensors (a declared component alone is not one)."""
    return any(n.startswith("vision/") for n in bindings)


def bind(
    sf: SeedFile,
    c: TextConfig,
    bindings: dict[str, tuple[Part, ...]],
    mtp: bool,
    vision: dict[str, Any] | None = None,
    dflash: list[Target] | None = None,
) -> tuple[list[tuple[Target, tuple[Part, ...]]], list[str]]:
    """Our tensors with the object parts they are made of, and the logical names left unloaded
    (DFlash 2, a DFlash drafter without `dflash`, its targets (`seed_dflash`), a full-vocabulary
    proposal head; the vision tower without `vision`, its HF-style config; the indexed proposal head
    is our `lm_head_draft`, loaded when a flag asks for it). A missing parameter, a wrong element
    count, or a text / MTP (with `dflash`: DFlash) name our model does not have is a
    `SeedFormatError` naming it."""
    plan: list[tuple[Target, tuple[Part, ...]]] = []
    used: set[str] = set()
    wanted = targets(c, mtp) + ([] if vision is None else vision_targets(vision, c.hidden_size))
    proposal = proposal_targets(c, bindings)
    _check_proposal(sf, proposal)
    wanted += proposal + (dflash or [])
    for t in wanted:
        parts: list[Part] = []
        for logical, shape in t.sources:
            got = bindings.get(logical)
            if got is None:
                raise SeedFormatError(f"{sf.path}: no binding for parameter {logical!r} (our {t.name})")
            want = 1
            for d in shape:
                want *= d
            have = sum(p.end - p.begin for p in got)
            if have != want:
                raise SeedFormatError(
                    f"{sf.path}: parameter {logical!r} has {have} elements, the model's {list(shape)} has {want}"
                )
            used.add(logical)
            parts.extend(got)
        plan.append((t, tuple(parts)))
    left = sorted(set(bindings) - used)
    unloaded = tuple(p for p in NOT_LOADED if not (dflash and p == "dflash/"))
    unknown = [n for n in left if not n.startswith(unloaded)]
    if unknown:
        raise SeedFormatError(
            f"{sf.path}: parameter {unknown[0]!r} has no place in this {c.family} model"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
        )
    return plan, left
