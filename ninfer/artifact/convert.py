"""Converts a Hugging Face Qwen3.5/3.6 checkpoint into a `.ninfer` artifact, one source file at a time."""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open

from ninfer.artifact import registry
from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.hf_source import HfSource, read_hf_source
from ninfer.artifact.manifest import ArtifactIdentity
from ninfer.artifact.reader import MEDIA_CONFIGS, MEDIA_DIR
from ninfer.artifact.shapes import expected_shapes
from ninfer.artifact.writer import SHARD_BYTES, ArtifactWriter, generation_json
from ninfer.model.config import TextConfig, UnknownArchitectureError

DTYPES: dict[str, torch.dtype | None] = {"keep": None, "bfloat16": torch.bfloat16, "float32": torch.float32}
TEMPLATES = ("qwen3_6", "qwen3_5", "qwen3_8")
_EXPERT = re.compile(r"^(?P<p>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<k>gate_proj|up_proj|down_proj)\.weight$")
_MTP_LAYER = re.compile(r"^mtp\.layers\.(\d+)\.")


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


class ExpertFuser:
    """Collects per-expert `{gate,up,down}_proj` tensors and emits the fused 3-D ones when complete."""

    def __init__(self, num_experts: int) -> None:
        self.e = num_experts
        self.pending: dict[tuple[str, str], dict[int, torch.Tensor]] = defaultdict(dict)

    def add(self, prefix: str, expert: int, kind: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        self.pending[(prefix, kind)][expert] = t
        out: list[tuple[str, torch.Tensor]] = []
        gate, up = self.pending.get((prefix, "gate_proj"), {}), self.pending.get((prefix, "up_proj"), {})
        if kind in ("gate_proj", "up_proj") and len(gate) == self.e and len(up) == self.e:
            # [E, 2*Ie, H]: each expert's gate rows first, then its up rows
            fused = torch.stack([torch.cat([gate[i], up[i]], dim=0) for i in range(self.e)])
            out.append((f"{prefix}.gate_up_proj", fused))
            del self.pending[(prefix, "gate_proj")], self.pending[(prefix, "up_proj")]
        down = self.pending.get((prefix, "down_proj"), {})
        if kind == "down_proj" and len(down) == self.e:
            out.append((f"{prefix}.down_proj", torch.stack([down[i] for i in range(self.e)])))  # [E, H, Ie]
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


def convert(
    hf_dir: str | Path,
    out: str | Path,
    *,
    model_id: str | None = None,
    dtype: str = "keep",
    template: str | None = None,
    force: bool = False,
    max_shard_bytes: int = SHARD_BYTES,
) -> Path:
    """Convert `hf_dir` into the artifact directory `out`; returns `out`. Raises ArtifactError."""
    if dtype not in DTYPES:
        raise ArtifactError(f"unknown --dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    cast = DTYPES[dtype]
    src = read_hf_source(hf_dir)
    base = _text_config(src, 0)
    names, mtp_layers, lm_head_missing = _plan(src, int(base.num_experts or 0))
    config = dataclasses.replace(base, mtp_num_hidden_layers=mtp_layers)
    text_cfg = src.config.get("text_config") or src.config
    tied = lm_head_missing and bool(
        text_cfg.get("tie_word_embeddings", src.config.get("tie_word_embeddings"))
    )
    _check_names(config, names, tied)
    chat_template = _template(src, template)
    shapes = {c: expected_shapes(config, c) for c in ("text", "mtp")}
    fuser = ExpertFuser(int(config.num_experts or 0))

    with ArtifactWriter(Path(out), overwrite=force, max_shard_bytes=max_shard_bytes) as writer:

        def emit(comp: str, name: str, t: torch.Tensor) -> None:
            want = (shapes.get(comp) or {}).get(name)
            if want is not None and tuple(t.shape) != want:
                raise ArtifactError(
                    f"shape mismatch for {name}: checkpoint {list(t.shape)}, config {list(want)}"
                )
            writer.component(comp).add(name, t)

        for f in src.files:
            with safe_open(str(f), framework="pt", device="cpu") as sf:
                for key in sf.keys():
                    comp, name = map_name(key)
                    t = sf.get_tensor(key)
                    if cast is not None and t.is_floating_point():
                        t = t.to(cast)
                    if m := _EXPERT.match(name):
                        for fused_name, fused in fuser.add(m["p"], int(m["e"]), m["k"], t):
                            emit(comp, fused_name, fused)
                    else:
                        emit(comp, name, t)
                    if tied and name == "model.embed_tokens.weight":
                        emit("text", "lm_head.weight", t.clone())
        writer.write_json("config.json", config.to_dict())
        writer.write_json("generation.json", generation_json(config.eos_token_ids, src.generation_config))
        writer.write_text("frontend/chat_template.jinja", chat_template)
        write_tokenizer(writer, src.tokenizer_json)
        for name in MEDIA_CONFIGS:  # the image / video processor parameters, when the checkpoint has them
            if (src.root / name).is_file():
                writer.copy_file(f"{MEDIA_DIR}/{name}", src.root / name)
        return writer.finish(_identity(src, config, chat_template, model_id))
