"""A seed file's DFlash companion as our `dflash` component: its objects bound onto our drafter's
parameters (`ninfer.model.dflash`, the HF names our component stores) and the drafter's config
taken from where the file declares it.

The objects (the seed's `qwen3.6-35b-a3b-artifact.md` §8 inventory, §13.3 source mapping; its
binder validates the same names and shapes):

    dflash/feature_projection [H, n*H]          fc.weight (n target layers feed the features)
    dflash/context_norm [H]                     hidden_norm.weight
    dflash/layers/{l}/input_norm                layers.{l}.input_layernorm.weight
      attention/query_key_value [q+2kv, H]      rows [query ; key ; value] (§3.2, §9.1):
                                                layers.{l}.self_attn.{q,k,v}_proj.weight
      attention/query_norm, key_norm [D]        self_attn.{q,k}_norm.weight
      attention/output [H, q]                   self_attn.o_proj.weight
      post_attention_norm [H]                   post_attention_layernorm.weight
      mlp/gate_up [2I, H]                       rows [gate ; up]: mlp.{gate,up}_proj.weight
      mlp/down [H, I]                           mlp.down_proj.weight
    dflash/final_norm [H]                       norm.weight

Its matrices are W8 (§3.1): they load as stored (`QuantWeight` row slices of the fused parents) and
`load_dflash` dequantizes them, the drafter running dense weights.

The config. A v2 file declares none ("the artifact JSON does not add target-private fields for ...
DFlash feature-layer ids, DFlash attention classes, DFlash block size, or the DFlash mask id. These
are fixed by this target contract", §1): the shapes give the layer count, widths, heads, head dim,
FFN width and the number of feature layers (`v2_geometry`); the rest is what the seed documents as
fixed for the file's model (`V2_DFLASH`); a model it documents no DFlash for leaves the drafter not
loaded, the message naming the first missing field. A v3 file's `dflash` component carries an
HF-style config (its container reference: components `text`, `vision`, `mtp`, `dflash`, `dflash2`,
each with an HF-style `config`), read as a drafter checkpoint's config.json. Its bindings are taken
under the names the v2 split gives (`attention/{query,key,value}`, `mlp/{gate,up}`), as v3 binds the
rows of the text model's fused parents; our copy of the seed's documents does not spell the v3
DFlash names, and any other spelling is refused by name (no binding for the parameter).
DFlash 2 (`dflash2`) is not loaded: our drafter runs `DFlashDraftModel` only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ninfer.artifact.seed_container import Part, SeedFile, SeedFormatError
from ninfer.artifact.seed_layouts import Target
from ninfer.model.config import TextConfig
from ninfer.model.dflash import FULL_ATTENTION, SLIDING_ATTENTION, DFlashConfig

PREFIX = "dflash/"
_LAYER = re.compile(r"dflash/layers/(\d+)/(.+)")
_QKV, _GATE_UP = "attention/query_key_value", "mlp/gate_up"

# What the seed documents as fixed for a model's DFlash companion that a v2 file's shapes do not
# give (and the shapes it documents, checked against the file's). Qwen3.6-35B-A3B: the artifact
# reference §2 "Fixed target facts" (6 layers, hidden 2048, FFN 6144, 32 / 8 heads x 128, feature
# layers [1,6,11,16,22,27,32,37], block 16, mask row 248077, layers 0..4 sliding with window 4096,
# layer 5 full context) and the model reference §2.6 (RMSNorm eps 1e-6, RoPE theta 1e7, no
# projection bias) and §9 (all six layers non-causal; the window admits |p_j - p_i| < 4096; the
# block's rows are the target embeddings as they are; the final-normed hidden goes through the
# target's lm_head as it is: no embedding scale, logit multiplier or softcap).
V2_DFLASH: dict[str, dict[str, Any]] = {
    "qwen3.6-35b-a3b": {
        "num_hidden_layers": 6, "hidden_size": 2048, "intermediate_size": 6144,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "target_layer_ids": [1, 6, 11, 16, 22, 27, 32, 37], "block_size": 16, "mask_token_id": 248077,
        "layer_types": [SLIDING_ATTENTION] * 5 + [FULL_ATTENTION], "sliding_window": 4096,
        "is_causal": False, "rms_norm_eps": 1e-6, "rope_theta": 1e7,
        "input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": None,
    },
}  # fmt: skip
# the fields a v2 file's shapes do not determine: each must be documented for its model
V2_FACTS = (
    "target_layer_ids", "mask_token_id", "block_size", "layer_types", "sliding_window", "is_causal",
    "rms_norm_eps", "rope_theta", "input_embedding_scale", "output_multiplier", "final_logit_softcapping",
)  # fmt: skip
GEOMETRY = (
    "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "head_dim",
)  # fmt: skip


def carries_dflash(names: Iterable[str]) -> bool:
    """Whether logical names (a file's bindings) hold a DFlash (not DFlash 2) companion's parameters
    (a v3 `dflash` component declared without them is no drafter, as for vision)."""
    return any(n.startswith(PREFIX) for n in names)


def _layer_objects(hd: int, q: int, kv: int, h: int, i: int) -> dict[str, tuple[int, ...]]:
    return {
        "input_norm": (h,),
        _QKV: (q + 2 * kv, h),
        "attention/query_norm": (hd,),
        "attention/key_norm": (hd,),
        "attention/output": (h, q),
        "post_attention_norm": (h,),
        _GATE_UP: (2 * i, h),
        "mlp/down": (h, i),
    }


def v2_geometry(sf: SeedFile) -> dict[str, int]:
    """What a v2 file's DFlash shapes determine (`GEOMETRY` and `features`, the number of target
    layers the feature projection reads), after checking that every object of the §8 inventory is
    there with the shape those imply and that no other `dflash/` object is: a `SeedFormatError`
    naming the object otherwise."""
    names = {n for n, o in sf.objects.items() if n.startswith(PREFIX) and o.kind == "tensor"}
    layers = sorted({int(m[1]) for n in names if (m := _LAYER.fullmatch(n))})

    def shape(name: str, rank: int) -> tuple[int, ...]:
        if name not in names:
            raise SeedFormatError(f"{sf.path}: the DFlash companion has no object {name!r}")
        s = sf.objects[name].shape
        if len(s) != rank:
            raise SeedFormatError(f"{sf.path}: DFlash object {name!r}: shape {list(s)} is not of rank {rank}")
        return s

    fc = shape(PREFIX + "feature_projection", 2)
    h = fc[0]
    if fc[1] % h:
        raise SeedFormatError(
            f"{sf.path}: DFlash object {PREFIX + 'feature_projection'!r}: shape {list(fc)} is not [H, n * H]"
        )
    l0 = PREFIX + "layers/0/"
    hd = shape(l0 + "attention/query_norm", 1)[0]
    q = shape(l0 + "attention/output", 2)[1]
    kv2 = shape(l0 + _QKV, 2)[0] - q
    i = shape(l0 + "mlp/down", 2)[1]
    if q % hd or kv2 <= 0 or kv2 % (2 * hd) or (q // hd) % (kv2 // (2 * hd)):
        raise SeedFormatError(
            f"{sf.path}: DFlash layer 0: query_key_value rows {q + kv2}, output columns {q} and head "
            f"dim {hd} do not make query / key / value heads of one width (query heads a multiple of "
            "key / value heads)"
        )
    kv = kv2 // 2
    want = {
        PREFIX + "feature_projection": fc,
        PREFIX + "context_norm": (h,),
        PREFIX + "final_norm": (h,),
    }
    for layer in range(max(layers, default=0) + 1):
        for role, s in _layer_objects(hd, q, kv, h, i).items():
            want[f"{PREFIX}layers/{layer}/{role}"] = s
    for name, s in want.items():
        if tuple(shape(name, len(s))) != s:
            raise SeedFormatError(
                f"{sf.path}: DFlash object {name!r}: shape {list(sf.objects[name].shape)}, the "
                f"drafter's (from its layer 0 and feature projection) is {list(s)}"
            )
    extra = sorted(names - set(want))
    if extra:
        raise SeedFormatError(f"{sf.path}: DFlash object {extra[0]!r} has no place in the DFlash drafter")
    return {
        "num_hidden_layers": max(layers) + 1,  # every layer below it checked complete
        "hidden_size": h,
        "intermediate_size": i,
        "num_attention_heads": q // hd,
        "num_key_value_heads": kv // hd,
        "head_dim": hd,
        "features": fc[1] // h,
    }


def v2_split(bindings: dict[str, tuple[Part, ...]], g: dict[str, int]) -> dict[str, tuple[Part, ...]]:
    """The v2 bindings with each DFlash fused parent replaced by its rows: [query ; key ; value],
    [gate ; up] (the 35B-A3B reference §3.2 / §9.1)."""
    h, hd, i = g["hidden_size"], g["head_dim"], g["intermediate_size"]
    q, kv = g["num_attention_heads"] * hd, g["num_key_value_heads"] * hd
    out = dict(bindings)
    for layer in range(g["num_hidden_layers"]):
        base = f"{PREFIX}layers/{layer}/"
        for parent, rows in (
            (_QKV, (("query", q), ("key", kv), ("value", kv))),
            (_GATE_UP, (("gate", i), ("up", i))),
        ):
            (whole,) = out.pop(base + parent)
            prefix = base + parent.split("/")[0] + "/"
            cursor = whole.begin
            for role, r in rows:
                out[prefix + role] = (Part(whole.object, cursor, cursor + r * h),)
                cursor += r * h
    return out


def dflash_config(
    sf: SeedFile, text: TextConfig, geometry: dict[str, int] | None
) -> tuple[DFlashConfig | None, str]:
    """(the drafter's config, where it comes from) or (None, why it cannot be established)."""
    if sf.version >= 3:
        comp = sf.components.get("dflash")
        if comp is None:
            return None, "the file binds DFlash parameters but has no 'dflash' component (its config)"
        try:
            cfg = DFlashConfig.from_hf(comp.config)
        except KeyError as exc:
            return None, f"component 'dflash' config: missing field {exc}"
        except (TypeError, ValueError) as exc:
            return None, f"component 'dflash' config: {exc}"
        source = "component 'dflash' config"
    else:
        assert geometry is not None
        cfg_or_why = _v2_config(sf, geometry)
        if isinstance(cfg_or_why, str):
            return None, cfg_or_why
        cfg, source = cfg_or_why, f"its shapes and the seed's {sf.model_id} contract"
    why = _misfit(cfg, text)
    return (None, why) if why else (cfg, source)


def _v2_config(sf: SeedFile, g: dict[str, int]) -> DFlashConfig | str:
    facts = V2_DFLASH.get(str(sf.model_id), {})
    missing = [f for f in V2_FACTS if f not in facts]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        return (
            f"a v2 file declares no DFlash config and the seed documents none for model {sf.model_id!r}: "
            f"missing field {missing[0]!r}{more}"
        )
    for key in GEOMETRY:
        if key in facts and facts[key] != g[key]:
            return (
                f"the seed's {sf.model_id} contract fixes the DFlash {key} at {facts[key]}, this file's is "
                f"{g[key]} (a different drafter: its documented facts do not apply)"
            )
    if len(facts["target_layer_ids"]) != g["features"]:
        return (
            f"the feature projection reads {g['features']} target layers, the seed's {sf.model_id} "
            f"contract lists {len(facts['target_layer_ids'])} (target_layer_ids)"
        )
    if len(facts["layer_types"]) != g["num_hidden_layers"]:
        return (
            f"the file has {g['num_hidden_layers']} DFlash layers, the seed's {sf.model_id} contract "
            f"gives {len(facts['layer_types'])} attention classes (layer_types)"
        )
    softcap = facts["final_logit_softcapping"]
    return DFlashConfig(
        hidden_size=g["hidden_size"],
        num_hidden_layers=g["num_hidden_layers"],
        num_attention_heads=g["num_attention_heads"],
        num_key_value_heads=g["num_key_value_heads"],
        head_dim=g["head_dim"],
        intermediate_size=g["intermediate_size"],
        rms_norm_eps=float(facts["rms_norm_eps"]),
        rope_theta=float(facts["rope_theta"]),
        target_layer_ids=tuple(int(x) for x in facts["target_layer_ids"]),
        mask_token_id=int(facts["mask_token_id"]),
        block_size=int(facts["block_size"]),
        layer_types=tuple(facts["layer_types"]),
        sliding_window=facts["sliding_window"],
        is_causal=facts["is_causal"],
        attention_bias=False,  # the inventory has no bias object (§8)
        input_embedding_scale=float(facts["input_embedding_scale"]),
        output_multiplier=float(facts["output_multiplier"]),
        final_logit_softcapping=None if softcap is None else float(softcap),
    )


def _misfit(cfg: DFlashConfig, text: TextConfig) -> str:
    """Why the drafter does not fit the file's text model ("" when it does)."""
    n = len(text.layer_types)
    if cfg.hidden_size != text.hidden_size:
        return f"the DFlash hidden_size {cfg.hidden_size} is not the text model's {text.hidden_size}"
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < n]
    if bad:
        return f"DFlash target_layer_ids {bad} are outside the text model's {n} layers"
    if not 0 <= cfg.mask_token_id < text.vocab_size:
        return f"DFlash mask_token_id {cfg.mask_token_id} is outside the vocabulary ({text.vocab_size} rows)"
    if len(cfg.layer_types) != cfg.num_hidden_layers or set(cfg.layer_types) - {
        FULL_ATTENTION,
        SLIDING_ATTENTION,
    }:
        return f"DFlash layer_types {list(cfg.layer_types)} do not give each of its {cfg.num_hidden_layers} layers a class"
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        return (
            f"DFlash heads {cfg.num_attention_heads} are not a multiple of its key / value heads "
            f"{cfg.num_key_value_heads}"
        )
    return ""


def dflash_targets(cfg: DFlashConfig) -> list[Target]:
    """Our `dflash` tensors (the HF names of the drafter checkpoint) from the seed's logical names."""
    h, hd, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    out: list[Target] = []

    def t(name: str, shape: tuple[int, ...], logical: str) -> None:
        out.append(Target("dflash", name, shape, ((PREFIX + logical, shape),)))

    t("fc.weight", (h, len(cfg.target_layer_ids) * h), "feature_projection")
    t("hidden_norm.weight", (h,), "context_norm")
    for layer in range(cfg.num_hidden_layers):
        ours, seed = f"layers.{layer}.", f"layers/{layer}/"
        t(ours + "input_layernorm.weight", (h,), seed + "input_norm")
        for proj, role, shape in (
            ("q_proj", "query", (q, h)),
            ("k_proj", "key", (kv, h)),
            ("v_proj", "value", (kv, h)),
            ("o_proj", "output", (h, q)),
        ):
            t(f"{ours}self_attn.{proj}.weight", shape, seed + "attention/" + role)
        t(ours + "self_attn.q_norm.weight", (hd,), seed + "attention/query_norm")
        t(ours + "self_attn.k_norm.weight", (hd,), seed + "attention/key_norm")
        t(ours + "post_attention_layernorm.weight", (h,), seed + "post_attention_norm")
        for proj, role, shape in (
            ("gate_proj", "gate", (i, h)),
            ("up_proj", "up", (i, h)),
            ("down_proj", "down", (h, i)),
        ):
            t(f"{ours}mlp.{proj}.weight", shape, seed + "mlp/" + role)
    t("norm.weight", (h,), "final_norm")
    return out
