"""Converts a Hugging Face Qwen3.5/3.6 checkpoint into a `.ninfer` artifact, one source file at a time.

`weights` picks the profile (`profiles.PROFILES`): every text / MTP tensor is stored dense or
quantized (and split) as the profile says. A Hugging Face FP8 checkpoint (`quantization_config`
`quant_method: fp8`: e4m3 `weight` with an fp32 `weight_scale_inv` per 128 x 128 block) converts as
it is: its fp8 tensors become fp8 `QuantWeight`s without a pass through bf16, the tensors it left
unconverted (`modules_to_not_convert`) stay dense."""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open

from ninfer.artifact import profiles, registry
from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.hf_source import HfSource, read_hf_source
from ninfer.artifact.manifest import MEDIA_CONFIGS, MEDIA_DIR, ArtifactIdentity
from ninfer.artifact.quantize import store_as
from ninfer.artifact.shapes import expected_shapes
from ninfer.artifact.writer import SHARD_BYTES, ArtifactWriter, generation_json
from ninfer.formats import QuantWeight
from ninfer.formats.weight import cat_rows, stack_experts
from ninfer.model.config import TextConfig, UnknownArchitectureError

DTYPES: dict[str, torch.dtype | None] = {"keep": None, "bfloat16": torch.bfloat16, "float32": torch.float32}
TEMPLATES = ("qwen3_6", "qwen3_5", "qwen3_8")
_EXPERT = re.compile(r"^(?P<p>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<k>gate_proj|up_proj|down_proj)\.weight$")
_MTP_LAYER = re.compile(r"^mtp\.layers\.(\d+)\.")
SCALE_INV = (
    "_scale_inv"  # an FP8 checkpoint's block scale of tensor X: X_scale_inv (X.weight -> X.weight_scale_inv)
)


def map_name(key: str) -> tuple[str, str]:
    """(component, canonical name) of a Hugging Face tensor name (text, VL and MTP layouts)."""
    if key.startswith("model.language_model."):
        return "text", "model." + key.removeprefix("model.language_model.")
    if key.startswith("model.visual."):
        return "vision", key.removeprefix("model.")
    if key.startswith("visual."):
        return "vision", key
    if key.startswith("mtp."):
        return "mtp", key
    if key == "lm_head.weight" or key.startswith("model."):
        return "text", key
    raise ArtifactError(f"unrecognised tensor name {key!r} in the checkpoint")


Tensor = torch.Tensor | QuantWeight  # an FP8 checkpoint's experts arrive quantized


def _cat(a: Tensor, b: Tensor) -> Tensor:
    if isinstance(a, QuantWeight) and isinstance(b, QuantWeight):
        try:
            return cat_rows([a, b])
        except ValueError as err:
            raise ArtifactError(f"an expert's gate and up projections cannot form one bank: {err}") from None
    if isinstance(a, QuantWeight) or isinstance(b, QuantWeight):
        raise ArtifactError("an expert's gate and up projections differ in format")
    return torch.cat([a, b], dim=0)


def _stack(parts: list[Tensor]) -> Tensor:
    if all(isinstance(p, QuantWeight) for p in parts):
        return stack_experts(parts)  # type: ignore[arg-type]
    if any(isinstance(p, QuantWeight) for p in parts):
        raise ArtifactError("the experts of one bank differ in format")
    return torch.stack(parts)  # type: ignore[arg-type]


class ExpertFuser:
    """Collects per-expert `{gate,up,down}_proj` tensors and emits the fused 3-D ones when complete."""

    def __init__(self, num_experts: int) -> None:
        self.e = num_experts
        self.pending: dict[tuple[str, str], dict[int, Tensor]] = defaultdict(dict)

    def add(self, prefix: str, expert: int, kind: str, t: Tensor) -> list[tuple[str, Tensor]]:
        self.pending[(prefix, kind)][expert] = t
        out: list[tuple[str, Tensor]] = []
        gate, up = self.pending.get((prefix, "gate_proj"), {}), self.pending.get((prefix, "up_proj"), {})
        if kind in ("gate_proj", "up_proj") and len(gate) == self.e and len(up) == self.e:
            # [E, 2*Ie, H]: each expert's gate rows first, then its up rows
            fused = _stack([_cat(gate[i], up[i]) for i in range(self.e)])
            out.append((f"{prefix}.gate_up_proj", fused))
            del self.pending[(prefix, "gate_proj")], self.pending[(prefix, "up_proj")]
        down = self.pending.get((prefix, "down_proj"), {})
        if kind == "down_proj" and len(down) == self.e:
            out.append((f"{prefix}.down_proj", _stack([down[i] for i in range(self.e)])))  # [E, H, Ie]
            del self.pending[(prefix, "down_proj")]
        return out


def _text_config(src: HfSource, mtp_layers: int) -> TextConfig:
    try:
        config = TextConfig.from_hf(src.config, src.generation_config)
    except UnknownArchitectureError as exc:
        raise ArtifactError(f"unknown architecture: {exc}") from None
    except KeyError as exc:
        raise ArtifactError(f"{src.root / 'config.json'}: missing field {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{src.root / 'config.json'}: invalid config ({exc})") from None
    # the artifact's config describes the artifact: as many MTP layers as it carries tensors for
    return dataclasses.replace(config, mtp_num_hidden_layers=mtp_layers)


def _plan(src: HfSource, num_experts: int) -> tuple[dict[str, set[str]], int, bool]:
    """Final names per component, number of MTP layers, and whether lm_head is missing."""
    names: dict[str, set[str]] = defaultdict(set)
    experts: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    seen: dict[str, Path] = {}
    mtp_layers = 0
    for f, header in src.headers.items():
        for key in header:
            if key.endswith(SCALE_INV):
                continue  # an FP8 weight's block scales: read with their weight
            if key in seen:
                raise ArtifactError(f"tensor {key!r} is stored twice ({seen[key].name} and {f.name})")
            seen[key] = f
            comp, name = map_name(key)
            if m := _MTP_LAYER.match(name):
                mtp_layers = max(mtp_layers, int(m[1]) + 1)
            if m := _EXPERT.match(name):
                experts[(comp, m["p"], m["k"])].add(int(m["e"]))
            else:
                names[comp].add(name)
    for (comp, prefix, kind), idx in experts.items():
        if idx != set(range(num_experts)):
            raise ArtifactError(
                f"per-expert tensors {prefix}.*.{kind} cover experts {len(idx)}/{num_experts} "
                f"(ids {min(idx)}..{max(idx)}); the config has {num_experts}"
            )
        names[comp].add(f"{prefix}.{'down_proj' if kind == 'down_proj' else 'gate_up_proj'}")
    lm_head_missing = "lm_head.weight" not in names["text"]
    return names, mtp_layers, lm_head_missing


def _check_names(config: TextConfig, names: dict[str, set[str]], tied: bool) -> None:
    for comp in ("text", "mtp"):
        want = set(expected_shapes(config, comp) or {})
        have = names.get(comp, set()) | ({"lm_head.weight"} if comp == "text" and tied else set())
        if extra := sorted(have - want):
            raise ArtifactError(f"checkpoint tensor {extra[0]!r} does not belong to a {config.family} model")
        if missing := sorted(want - have):
            raise ArtifactError(f"checkpoint lacks tensor {missing[0]!r} ({len(missing)} missing in {comp})")


def _identity(src: HfSource, config: TextConfig, template: str, model_id: str | None) -> ArtifactIdentity:
    known = registry.lookup(model_id) if model_id else registry.recognize(config, template=template)
    mid = model_id or (known.model_id if known else src.name.lower())
    display = known.display_name if known else src.name
    return ArtifactIdentity(model_id=mid, family=config.family, display_name=display, source=src.source)


def _template(src: HfSource, name: str | None) -> str:
    if name is not None:
        if name not in TEMPLATES:
            raise ArtifactError(f"unknown template {name!r}; known: {', '.join(TEMPLATES)}")
        from ninfer.templates import read_template

        return read_template(name)
    if src.chat_template is None:
        raise ArtifactError(
            f"{src.root} has no chat template (chat_template.jinja or tokenizer_config.json); "
            f"pass --template {'|'.join(TEMPLATES)}"
        )
    return src.chat_template


def write_tokenizer(writer: ArtifactWriter, given: Path | None) -> None:
    """Copy the checkpoint's tokenizer.json, or the one built from the public BPE ranks."""
    if given is None:
        from ninfer.text.builder import cached_tokenizer_json

        given = cached_tokenizer_json()
    writer.copy_file("tokenizer/tokenizer.json", given)


def fp8_source(src: HfSource) -> bool:
    """Whether the checkpoint is a Hugging Face FP8 one (`quantization_config.quant_method == "fp8"`,
    128 x 128 weight blocks); other quantization methods are refused."""
    cfg = src.config.get("quantization_config") or (src.config.get("text_config") or {}).get(
        "quantization_config"
    )
    if not cfg:
        return False
    method = cfg.get("quant_method")
    if method != "fp8":
        raise ArtifactError(f"unsupported quantization_config.quant_method {method!r} (known: fp8)")
    block = cfg.get("weight_block_size", [128, 128])
    if list(block) != [128, 128]:
        raise ArtifactError(f"FP8 checkpoint with weight_block_size {block}: only [128, 128] is supported")
    fmt = cfg.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ArtifactError(f"FP8 checkpoint in {fmt!r}: only e4m3 is supported")
    return True


class Fp8Pairs:
    """Pairs an FP8 checkpoint's e4m3 tensors with their `_scale_inv` blocks (either may come first)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.scales: dict[str, torch.Tensor] = {}

    def add(self, key: str, t: torch.Tensor) -> tuple[str, QuantWeight] | None:
        """Record a weight or a scale; (weight key, QuantWeight) once both halves are in."""
        from ninfer.formats.registry import FP8

        if key.endswith(SCALE_INV):
            wkey = key.removesuffix(SCALE_INV)
            self.scales[wkey] = t
        else:
            wkey = key
            self.weights[wkey] = t
        if wkey not in self.weights or wkey not in self.scales:
            return None
        w, s = self.weights.pop(wkey), self.scales.pop(wkey).to(torch.float32)
        if w.dim() == 3:  # a fused expert bank [E, N, K] with scales [E, N/128, K/128]
            s = s.reshape(-1, s.shape[-1])
        try:
            return wkey, QuantWeight(FP8, tuple(w.shape), w, None, s)
        except ValueError as err:
            raise ArtifactError(f"FP8 tensor {wkey}: {err}") from None

    def check_done(self) -> None:
        left = sorted(self.weights) + sorted(k + SCALE_INV for k in self.scales)
        if left:
            raise ArtifactError(f"FP8 tensor {left[0]!r} has no matching weight / {SCALE_INV} partner")


def convert(
    hf_dir: str | Path,
    out: str | Path,
    *,
    model_id: str | None = None,
    dtype: str = "keep",
    template: str | None = None,
    force: bool = False,
    max_shard_bytes: int = SHARD_BYTES,
    weights: str | None = None,
) -> Path:
    """Convert `hf_dir` into the artifact directory `out`; returns `out`. Raises ArtifactError.

    weights: the profile (None: as the source is, bf16 / fp32, or fp8 for an FP8 checkpoint)."""
    if dtype not in DTYPES:
        raise ArtifactError(f"unknown --dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    cast = DTYPES[dtype]
    src = read_hf_source(hf_dir)
    fp8 = fp8_source(src)
    if fp8 and weights not in (None, "fp8"):
        raise ArtifactError(
            f"{src.root} is an FP8 checkpoint: it converts as it is (--weights fp8); "
            f"--weights {weights} needs the bf16 checkpoint"
        )
    profile = weights or ("fp8" if fp8 else "bf16")
    try:
        profiles.check_profile(profile)
    except ValueError as err:
        raise ArtifactError(str(err)) from None
    base = _text_config(src, 0)
    names, mtp_layers, lm_head_missing = _plan(src, int(base.num_experts or 0))
    config = dataclasses.replace(base, mtp_num_hidden_layers=mtp_layers)
    text_cfg = src.config.get("text_config") or src.config
    tied = lm_head_missing and bool(
        text_cfg.get("tie_word_embeddings", src.config.get("tie_word_embeddings"))
    )
    _check_names(config, names, tied)
    chat_template = _template(src, template)
    identity = _identity(src, config, chat_template, model_id)
    shapes = {c: expected_shapes(config, c) for c in ("text", "mtp")}
    fuser = ExpertFuser(int(config.num_experts or 0))
    pairs = Fp8Pairs()

    with ArtifactWriter(Path(out), overwrite=force, max_shard_bytes=max_shard_bytes) as writer:
        writer.profile = profile

        def emit(comp: str, name: str, t: Tensor) -> None:
            want = (shapes.get(comp) or {}).get(name)
            if want is not None and tuple(t.shape) != want:
                raise ArtifactError(
                    f"shape mismatch for {name}: checkpoint {list(t.shape)}, config {list(want)}"
                )
            cw = writer.component(comp)
            # as the checkpoint has it: vision; every tensor of an FP8 checkpoint (what it left dense stays so)
            if isinstance(t, QuantWeight) or want is None or fp8:
                cw.add_quantized(name, t) if isinstance(t, QuantWeight) else cw.add(name, t)
                return
            for stored, part in store_as(profile, config, identity.model_id, name, t):
                cw.add_quantized(stored, part) if isinstance(part, QuantWeight) else cw.add(stored, part)

        for f in src.files:
            with safe_open(str(f), framework="pt", device="cpu") as sf:
                for key in sf.keys():
                    raw = sf.get_tensor(key)
                    t: Tensor = raw
                    if fp8 and (key.endswith(SCALE_INV) or raw.dtype == torch.float8_e4m3fn):
                        paired = pairs.add(key, raw)
                        if paired is None:
                            continue
                        key, t = paired
                    elif cast is not None and raw.is_floating_point():
                        t = raw.to(cast)
                    comp, name = map_name(key)
                    if m := _EXPERT.match(name):
                        for fused_name, fused in fuser.add(m["p"], int(m["e"]), m["k"], t):
                            emit(comp, fused_name, fused)
                    else:
                        emit(comp, name, t)
                    if tied and name == "model.embed_tokens.weight":
                        emit("text", "lm_head.weight", t.clone() if isinstance(t, torch.Tensor) else t)
        pairs.check_done()
        writer.write_json("config.json", config.to_dict())
        writer.write_json("generation.json", generation_json(config.eos_token_ids, src.generation_config))
        writer.write_text("frontend/chat_template.jinja", chat_template)
        write_tokenizer(writer, src.tokenizer_json)
        for name in MEDIA_CONFIGS:  # the image / video processor parameters, when the checkpoint has them
            if (src.root / name).is_file():
                writer.copy_file(f"{MEDIA_DIR}/{name}", src.root / name)
        return writer.finish(identity)
