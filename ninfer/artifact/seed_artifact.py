"""A seed-format `.ninfer` file opened as our `Artifact`: config, identity, frontend resources and
the text / MTP tensors our model loads, assembled from the file's objects and bindings.

- Groupwise-int objects (Q4 / Q5 / Q6 / W8, `row_split_k128_v1`) are our `QuantWeight` planes as
  they lie in the file: a fused parent's rows are plane row-slices (views, no copy, no re-packing);
  a routed-expert parent is an expert bank by reshape. Only a tensor whose rows come from two
  parents of different formats (no such contract is published) is dequantized to bf16.
- Direct objects (bf16 / fp32 / int32 / int64) load as they are (the GDN convolution transposed).
- NVFP4 (matrices and expert banks), row-scaled FP8 and u4z8 objects have no kernel of ours: they
  are dequantized on load to bf16 and run as bf16 weights (full bf16 memory and bandwidth); `inspect`
  and the load log say so.
- The vision tower (when the file carries its tensors) is the `vision` component, every matrix
  dense (groupwise ones dequantized to bf16): our tower runs dense weights.
- The indexed proposal head (`proposal/head` rows of the output head for `proposal/token_ids`) is our
  `lm_head_draft` component, in its stored format (`--lm-head-draft` with `--spec mtp`).
- The DFlash companion is our `dflash` component (`--spec dflash`), its W8 matrices as stored, its
  config from the file's declaration or, for v2, its shapes and the seed's documented facts
  (`seed_dflash`); when that config cannot be established the drafter is not loaded and
  `--spec dflash` is refused naming why. Not loaded: DFlash 2 (`dflash2`), and a proposal over the
  full vocabulary (the output head itself: there is no reduced head to load); a flag that asks for
  one is refused by `not_loaded`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ninfer.artifact.files import TensorInfo
from ninfer.artifact.manifest import FORMAT_VERSION, ArtifactIdentity, Component, Manifest
from ninfer.artifact.quant_store import QuantSpec
from ninfer.artifact.reader import Artifact
from ninfer.artifact.registry import lookup
from ninfer.artifact.seed_container import FORMATS, Part, SeedFile, SeedFormatError, decode, read_seed_file
from ninfer.artifact.seed_dflash import carries_dflash, dflash_config, dflash_targets, v2_geometry, v2_split
from ninfer.artifact.seed_layouts import V2_MODELS, V2_VISION, Target, bind, has_mtp, has_vision, v2_bindings
from ninfer.artifact.writer import generation_json
from ninfer.formats.registry import format_of, plane_shapes
from ninfer.model.config import DENSE, MOE, TextConfig, UnknownArchitectureError

if TYPE_CHECKING:
    import torch

    from ninfer.formats import QuantWeight
    from ninfer.model.dflash import DFlashConfig

log = logging.getLogger("ninfer.artifact")
NATIVE_KINDS = ("direct", "groupwise")  # loaded as stored; every other kind is dequantized to bf16
_DTYPE_TAG = {"bf16": "BF16", "fp32": "F32", "int32": "I32", "int64": "I64"}
_SIZES = {"BF16": 2, "F32": 4, "I32": 4, "I64": 8}
# our component -> (the seed components / logical-name prefixes carrying it, what it is, the flag)
_UNLOADED = {
    "dflash": (("dflash2",), "DFlash 2 drafter (ours runs DFlashDraftModel)", "--spec dflash"),
    "lm_head_draft": (("proposal",), "full-vocabulary proposal head (no reduced head)", "--lm-head-draft"),
}
SEED_MODEL_OF_FAMILY = {DENSE: "qwen3.6-27b", MOE: "qwen3.6-35b-a3b"}  # the seed's model per architecture


@dataclass
class SeedArtifact(Artifact):
    """An opened seed container; `load_tensors` assembles our canonical tensors from its objects."""

    seed: SeedFile | None = None
    plan: dict[str, list[tuple[Target, tuple[Part, ...]]]] = field(default_factory=dict)
    unloaded: list[str] = field(default_factory=list)  # logical parameters of components not loaded
    frontend_dir: Path = Path()
    dflash: DFlashConfig | None = None  # the DFlash drafter's config, when the file's is established
    dflash_source: str = ""  # where that config comes from, or why it cannot be established

    @property
    def sf(self) -> SeedFile:
        assert self.seed is not None
        return self.seed

    @property
    def tokenizer_path(self) -> Path:
        return self.frontend_dir / "tokenizer.json"

    @property
    def sampler_model_id(self) -> str:
        """The seed takes its sampler presets from the model it runs, never from the file's
        generation config: a registered id keeps its own, any other public name those of the seed's
        model of its architecture (the 35B-A3B's differ from the 27B's)."""
        return self.model_id if lookup(self.model_id) is not None else SEED_MODEL_OF_FAMILY[self.family]

    def not_loaded(self, component: str) -> str | None:
        """A DFlash drafter whose config cannot be established, DFlash 2, and a proposal head that is
        not indexed are not loaded: a flag that asks for one is refused before anything loads (not
        "the artifact has none")."""
        if component not in _UNLOADED or component in self.plan:
            return None
        if component == "dflash" and carries_dflash(self.unloaded):
            return (
                f"the DFlash drafter of this seed .ninfer file is not loaded, its config cannot be "
                f"established ({self.dflash_source}): drop --spec dflash"
            )
        seed_components, what, flag = _UNLOADED[component]
        carried = any(c in self.sf.components for c in seed_components) or any(
            n.startswith(tuple(c + "/" for c in seed_components)) for n in self.unloaded
        )
        if not carried:
            return None
        return (
            f"the {what} of a seed .ninfer file is not loaded (the text model and MTP head are): drop {flag}"
        )

    def dflash_config(self) -> DFlashConfig:
        if self.dflash is None:
            raise ValueError(f"{self.path}: no DFlash drafter loads from this file ({self.dflash_source})")
        return self.dflash

    def media_config(self, name: str) -> dict[str, Any] | None:
        ref = self.sf.resource_roles().get(name)
        return None if ref is None else _json_resource(self.sf, ref)

    def _component(self, name: str) -> dict[str, dict[str, TensorInfo]]:
        if name not in self.plan:
            raise SeedFormatError(f"{self.path}: no component {name!r} (has {list(self.plan)})")
        return {self.path.name: self.tensor_infos(name)}

    def stored_formats(self, component: str) -> dict[str, tuple[str, ...]]:
        """Our tensor -> the seed formats of the objects it is made of."""
        objs = self.sf.objects
        return {
            t.name: tuple(dict.fromkeys(objs[p.object].format for p in parts))
            for t, parts in self.plan.get(component, [])
        }

    def dequantized_on_load(self) -> list[str]:
        """Our tensors (all components) that are dequantized to bf16 because no kernel of ours runs
        their stored format (NVFP4, row-scaled FP8, u4z8)."""
        return [
            name
            for comp in self.plan
            for name, fmts in self.stored_formats(comp).items()
            if any(FORMATS[f].kind not in NATIVE_KINDS for f in fmts)
        ]

    def tensor_infos(self, component: str) -> dict[str, TensorInfo]:
        if component not in self.plan:
            raise SeedFormatError(f"{self.path}: no component {component!r} (has {list(self.plan)})")
        out: dict[str, TensorInfo] = {}
        quant = self.quantized.get(component, {})
        for t, parts in self.plan[component]:
            spec = quant.get(t.name)
            if spec is not None:
                fmt = format_of(spec.fmt)
                nbytes = 0
                for plane, shape in plane_shapes(spec.shape, fmt).items():
                    per_row = shape[1] * (2 if plane == "scale" else 1)
                    nbytes += shape[0] * per_row
                out[t.name] = TensorInfo(dtype=fmt.name, shape=spec.shape, nbytes=nbytes)
                continue
            tag = _dense_tag(self.sf, parts)
            n = 1
            for d in t.shape:
                n *= d
            out[t.name] = TensorInfo(dtype=tag, shape=t.shape, nbytes=n * _SIZES[tag])
        return out

    def load_tensors(
        self, component: str, device: str | torch.device = "cpu"
    ) -> dict[str, torch.Tensor | QuantWeight]:
        import torch

        if component not in self.plan:
            raise SeedFormatError(f"{self.path}: no component {component!r} (has {list(self.plan)})")
        decoded: dict[str, dict[str, torch.Tensor]] = {}

        def planes(name: str) -> dict[str, torch.Tensor]:
            if name not in decoded:
                decoded[name] = decode(self.sf, self.sf.objects[name])
            return decoded[name]

        out: dict[str, torch.Tensor | QuantWeight] = {}
        quant = self.quantized.get(component, {})
        slow = []
        for t, parts in self.plan[component]:
            if t.name in quant:
                w: torch.Tensor | QuantWeight = self._quant(t, parts, quant[t.name], planes)
            else:
                w = self._dense(t, parts, planes)
                if any(FORMATS[self.sf.objects[p.object].format].kind not in NATIVE_KINDS for p in parts):
                    slow.append(t.name)
            out[t.name] = w if torch.device(device).type == "cpu" else w.to(device)
        if slow:
            log.warning(
                "%s: %d %s tensors stored as NVFP4 / row-scaled FP8 / u4z8 are dequantized to bf16 at load "
                "(no kernel of ours runs those formats: bf16 memory and speed for them)",
                self.path.name, len(slow), component,
            )  # fmt: skip
        return out

    def _quant(self, t: Target, parts: tuple[Part, ...], spec: QuantSpec, planes: Any) -> QuantWeight:
        """Row slices of the parents' planes (consecutive parts of one parent merged into one view)."""
        from ninfer.formats.weight import QuantWeight, cat_rows

        fmt = format_of(spec.fmt)
        runs: list[tuple[str, int, int]] = []
        for p in parts:
            k = self.sf.objects[p.object].shape[-1]
            if p.begin % k or p.end % k:
                raise SeedFormatError(
                    f"{self.path}: a binding of {t.name} takes elements [{p.begin}, {p.end}) of "
                    f"{p.object!r}, not whole rows of its {k} columns"
                )
            r0, r1 = p.begin // k, p.end // k
            if runs and runs[-1][0] == p.object and runs[-1][2] == r0:
                runs[-1] = (p.object, runs[-1][1], r1)
            else:
                runs.append((p.object, r0, r1))
        pieces = []
        for name, r0, r1 in runs:
            pl = planes(name)
            high = pl.get("high")
            k = self.sf.objects[name].shape[-1]
            pieces.append(
                QuantWeight(
                    fmt,
                    (r1 - r0, k),
                    pl["base"][r0:r1],
                    None if high is None else high[r0:r1],
                    pl["scale"][r0:r1],
                )
            )
        # two runs: the parent's row order differs from ours; concatenating the planes is a copy
        w = pieces[0] if len(pieces) == 1 else cat_rows(pieces)
        if w.shape != t.shape:  # an expert bank [E, N, K] over the parent's E * N rows
            w = QuantWeight(fmt, t.shape, w.base, w.high, w.scale)
        return w

    def _dense(self, t: Target, parts: tuple[Part, ...], planes: Any) -> torch.Tensor:
        import torch

        tag = _dense_tag(self.sf, parts)
        dtype = {"BF16": torch.bfloat16, "F32": torch.float32, "I32": torch.int32, "I64": torch.int64}[tag]
        flats = []
        for p in parts:
            obj = self.sf.objects[p.object]
            kind = FORMATS[obj.format].kind
            pl = planes(p.object)
            if kind == "direct":
                v = pl["values"].reshape(-1)
            elif kind == "groupwise":  # a mixed-format concatenation (see the module docstring)
                from ninfer.formats.weight import QuantWeight

                fmt = format_of(obj.format)
                v = (
                    QuantWeight(fmt, obj.shape, pl["base"], pl.get("high"), pl["scale"])
                    .dequantize()
                    .reshape(-1)
                )
            else:
                v = pl["dense"].reshape(-1)
            flats.append(v[p.begin : p.end].to(dtype))
        x = flats[0] if len(flats) == 1 else torch.cat(flats)
        if t.transform == "conv":  # tap-major [taps, C] -> [C, 1, taps]
            taps, c = t.sources[0][1]
            return x.view(taps, c).t().contiguous().view(t.shape)
        return x.view(t.shape)


def _dense_tag(sf: SeedFile, parts: tuple[Part, ...]) -> str:
    """The dtype a dense tensor of ours gets: its direct format when every part has that one, else bf16."""
    fmts = {sf.objects[p.object].format for p in parts}
    if len(fmts) == 1 and FORMATS[next(iter(fmts))].kind == "direct":
        return _DTYPE_TAG[next(iter(fmts))]
    return "BF16"


def _json_resource(sf: SeedFile, name: str) -> dict[str, Any]:
    try:
        d = json.loads(sf.resource(name).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SeedFormatError(f"{sf.path}: resource {name!r} is not valid JSON ({exc})") from None
    if not isinstance(d, dict):
        raise SeedFormatError(f"{sf.path}: resource {name!r} is not a JSON object")
    return d


def _frontend_dir(sf: SeedFile, tokenizer: bytes) -> Path:
    """A cache directory holding the file's tokenizer.json (our tokenizer loads from a path)."""
    digest = hashlib.sha256(tokenizer).hexdigest()[:24]
    root = Path(os.environ.get("NINFER_SEED_CACHE") or Path(tempfile.gettempdir()) / "ninfer-seed") / digest
    target = root / "tokenizer.json"
    if not target.is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".tokenizer.{os.getpid()}.tmp"
        tmp.write_bytes(tokenizer)
        tmp.replace(target)
    return root


def _config(sf: SeedFile, bindings: dict[str, tuple[Part, ...]], gen: dict[str, Any]) -> TextConfig:
    if sf.version >= 3:
        hf, where = sf.components["text"].config, "component 'text' config"
    else:
        if sf.model_id not in V2_MODELS:
            raise SeedFormatError(
                f"{sf.path}: unknown model_id {sf.model_id!r} (a v2 file carries no config; "
                f"known: {', '.join(sorted(V2_MODELS))})"
            )
        hf, where = V2_MODELS[str(sf.model_id)], f"model {sf.model_id}"
    try:
        cfg = TextConfig.from_hf(hf, gen)
    except UnknownArchitectureError as exc:
        raise SeedFormatError(f"{sf.path}: {where}: {exc}") from None
    except KeyError as exc:
        raise SeedFormatError(f"{sf.path}: {where}: missing field {exc}") from None
    except (TypeError, ValueError) as exc:
        raise SeedFormatError(f"{sf.path}: {where}: invalid ({exc})") from None
    mtp_layers = {n.split("/")[2] for n in bindings if n.startswith("mtp/layers/")}
    return dataclasses.replace(cfg, mtp_num_hidden_layers=len(mtp_layers) if has_mtp(sf, bindings) else 0)


def _vision_config(sf: SeedFile, out_hidden: int) -> dict[str, Any]:
    """The vision tower's HF-style config: the v3 `vision` component's, a registered id's for v2;
    its merger writes the text model's width (`out_hidden_size`, not stored by the seed)."""
    if sf.version >= 3:
        if "vision" not in sf.components:
            raise SeedFormatError(f"{sf.path}: vision tensors but no 'vision' component")
        cfg = dict(sf.components["vision"].config)
    elif str(sf.model_id) in V2_VISION:
        cfg = dict(V2_VISION[str(sf.model_id)])
    else:
        raise SeedFormatError(
            f"{sf.path}: vision tensors, but model_id {sf.model_id!r} has no registered tower"
        )
    for key in (
        "depth",
        "hidden_size",
        "intermediate_size",
        "num_heads",
        "patch_size",
        "num_position_embeddings",
    ):
        if not isinstance(cfg.get(key), int) or isinstance(cfg.get(key), bool) or cfg[key] <= 0:
            raise SeedFormatError(
                f"{sf.path}: vision config: {key} must be a positive integer, not {cfg.get(key)!r}"
            )
    cfg.setdefault("out_hidden_size", out_hidden)
    return cfg


def open_seed(path: str | Path) -> SeedArtifact:
    """Open a seed container as an `Artifact` (every problem: `SeedFormatError`)."""
    sf = read_seed_file(path)
    roles = sf.resource_roles()
    for need in ("tokenizer.json", "chat_template.jinja"):
        if need not in roles:
            raise SeedFormatError(f"{sf.path}: no {need} resource")
    gen_cfg = _json_resource(sf, roles["generation_config.json"]) if "generation_config.json" in roles else {}
    bindings = sf.bindings if sf.version >= 3 else v2_bindings(sf, _config(sf, {}, gen_cfg))
    config = _config(sf, bindings, gen_cfg)
    if has_vision(bindings):
        config = dataclasses.replace(config, vision=_vision_config(sf, config.hidden_size))
    drafter, drafter_source = None, ""
    if carries_dflash(bindings):
        geometry = None
        if sf.version == 2:  # the inventory checked, the fused parents split by its shapes
            geometry = v2_geometry(sf)
            bindings = v2_split(bindings, geometry)
        drafter, drafter_source = dflash_config(sf, config, geometry)
    plan_list, unloaded = bind(
        sf,
        config,
        bindings,
        config.mtp_num_hidden_layers > 0,
        config.vision,
        None if drafter is None else dflash_targets(drafter),
    )
    plan: dict[str, list[tuple[Target, tuple[Part, ...]]]] = {}
    quantized: dict[str, dict[str, QuantSpec]] = {}
    for t, parts in plan_list:
        plan.setdefault(t.component, []).append((t, parts))
        fmts = {sf.objects[p.object].format for p in parts}
        groupwise = len(fmts) == 1 and FORMATS[next(iter(fmts))].kind == "groupwise"
        if groupwise and len(t.shape) >= 2 and t.component != "vision":  # the tower runs dense weights
            quantized.setdefault(t.component, {})[t.name] = QuantSpec(
                format_of(next(iter(fmts))).name, t.shape
            )
    try:
        template = sf.resource(roles["chat_template.jinja"]).decode("utf-8")
    except UnicodeDecodeError:
        raise SeedFormatError(f"{sf.path}: resource {roles['chat_template.jinja']!r} is not UTF-8") from None
    model_id = sf.model_id or str(sf.components["text"].config.get("model_type", sf.path.stem))
    identity = ArtifactIdentity(
        model_id=model_id, family=config.family, display_name=model_id, source=sf.path.name
    )
    art = SeedArtifact(
        path=sf.path,
        manifest=Manifest(FORMAT_VERSION, identity, {}, {}, f"seed .ninfer v{sf.version}"),
        config=config,
        generation=generation_json(config.eos_token_ids, gen_cfg),
        chat_template=template,
        quantized=quantized,
        weight_profile=sf.weights_id or "seed-v3",
        seed=sf,
        plan=plan,
        unloaded=unloaded,
        frontend_dir=_frontend_dir(sf, sf.resource(roles["tokenizer.json"])),
        dflash=drafter,
        dflash_source=drafter_source,
    )
    art.manifest = Manifest(
        FORMAT_VERSION,
        identity,
        {
            c: Component(
                files=(sf.path.name,),
                tensor_count=len(p),
                bytes=sum(i.nbytes for i in art.tensor_infos(c).values()),
            )
            for c, p in plan.items()
        },
        {},
        f"seed .ninfer v{sf.version}",
    )
    return art
