"""Artifacts of a released model's shapes whose weights are drawn at load time (no weight files).

`python -m ninfer.artifact synth --shape qwen3.6-27b OUT` writes the manifest, config, tokenizer,
template and generation file of a released shape, and records in the manifest (`synthetic_weights`)
that every tensor is drawn from a seed when it is loaded: on the device, in the model's dtype, in
seconds. The whole service then runs at full size on a machine with a small disk; what it generates
is not meaningful. The reader (`reader.Artifact.load_tensors`) does the drawing; `inspect`, the
server log and `/v1/models` say that the weights are synthetic.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ninfer.artifact import profiles, quant_store, registry
from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.files import DTYPE_SIZES, TensorInfo
from ninfer.artifact.manifest import ArtifactIdentity, Component
from ninfer.artifact.quant_store import QuantSpec
from ninfer.artifact.released import RELEASED_GENERATION, RELEASED_SHAPES
from ninfer.artifact.shapes import expected_shapes, with_splits
from ninfer.model.config import TextConfig

if TYPE_CHECKING:
    import torch

    from ninfer.artifact.writer import ArtifactWriter

SYNTHETIC_KEY = "synthetic_weights"  # manifest.json top-level key: {"seed": int, "dtype": str}
WEIGHT_DTYPE = "BF16"  # the released checkpoints' dtype (A_log is F32 there too)


def tensor_dtype(name: str) -> str:
    """The safetensors dtype tag a released checkpoint stores `name` in."""
    return "F32" if name.endswith("A_log") else WEIGHT_DTYPE


def synth_config(shape: str, layers: int | None = None, mtp: bool = True) -> TextConfig:
    """The text config of released shape `shape`, optionally cut to its first `layers` layers
    (the hybrid pattern is kept: every fourth layer is gated attention)."""
    if shape not in RELEASED_SHAPES:
        raise ArtifactError(f"unknown shape {shape!r}; known: {', '.join(RELEASED_SHAPES)}")
    hf = dict(RELEASED_SHAPES[shape], mtp_num_hidden_layers=1 if mtp else 0)
    if layers is not None:
        if not 1 <= layers <= hf["num_hidden_layers"]:
            raise ArtifactError(f"--layers must be in 1..{hf['num_hidden_layers']} for {shape}, got {layers}")
        hf["num_hidden_layers"] = layers
    return TextConfig.from_hf(hf, RELEASED_GENERATION)


def synth(
    out: str | Path,
    shape: str,
    *,
    layers: int | None = None,
    mtp: bool = True,
    seed: int = 0,
    force: bool = False,
    weights: str = "bf16",
) -> Path:
    """Write a synthetic-weight artifact of released shape `shape` to `out`; returns `out`.
    `weights`: the profile whose formats the drawn tensors take (`profiles.PROFILES`)."""
    ident = registry.lookup(shape)
    assert ident is not None, shape  # every released shape is a registry identity
    cut = "" if layers is None else f", first {layers} layers"
    return write_synthetic(
        out,
        synth_config(shape, layers, mtp),
        ident,
        seed=seed,
        label=f"{shape} (seed {seed}{cut})",
        display=f"{ident.display_name} (synthetic {weights} weights{cut})",
        force=force,
        weights=weights,
    )


def write_synthetic(
    out: str | Path,
    config: TextConfig,
    ident: registry.Identity,
    *,
    seed: int,
    label: str,
    display: str,
    force: bool = False,
    weights: str = "bf16",
) -> Path:
    """Write an artifact of `config` without weight files: its text (and MTP) tensors are drawn
    from `seed` when loaded, in the formats profile `weights` gives them. `ident` gives the model
    id, template and sampler preset."""
    from ninfer.artifact.writer import ArtifactWriter

    try:
        profiles.check_profile(weights)
    except ValueError as err:
        raise ArtifactError(str(err)) from None
    components: dict[str, Component] = {}
    specs = {comp: quant_specs(config, comp, weights, ident.model_id) for comp in ("text", "mtp")}
    specs = {c: v for c, v in specs.items() if v}
    extra: dict[str, Any] = {SYNTHETIC_KEY: {"seed": seed, "dtype": "bfloat16"}}
    if specs:
        extra[quant_store.KEY] = quant_store.manifest_entry(weights, specs)
    for comp in ("text", "mtp"):
        headers = synthetic_headers(config, comp, specs.get(comp, {}))
        if headers:
            nbytes = sum(i.nbytes for i in headers.values())
            components[comp] = Component(files=(), tensor_count=len(headers), bytes=nbytes)
    with ArtifactWriter(Path(out), overwrite=force) as writer:
        write_model_files(writer, config, ident)
        identity = ArtifactIdentity(
            model_id=ident.model_id,
            family=config.family,
            display_name=display,
            source=f"ninfer synth {label}",
        )
        return writer.finish(identity, synthetic=components, extra=extra)


def write_model_files(writer: ArtifactWriter, config: TextConfig, ident: registry.Identity) -> None:
    """config.json, generation.json (the released stop ids, `ident`'s thinking preset), the
    registered chat template and the tokenizer built from the public BPE ranks."""
    from ninfer.artifact.convert import write_tokenizer
    from ninfer.artifact.writer import generation_json
    from ninfer.templates import read_template

    writer.write_json("config.json", config.to_dict())
    gen = {**RELEASED_GENERATION, "do_sample": True, **ident.thinking}
    writer.write_json("generation.json", generation_json(config.eos_token_ids, gen))
    writer.write_text("frontend/chat_template.jinja", read_template(ident.template))
    write_tokenizer(writer, None)


def quant_specs(config: TextConfig, component: str, profile: str, model_id: str) -> dict[str, QuantSpec]:
    """The quantized tensors profile `profile` gives a component of `config` (split parts included)."""
    shapes = expected_shapes(config, component) or {}
    out = {}
    for name, shape in shapes.items():
        for p in profiles.plan(profile, config, model_id, name, shape):
            if p.fmt is not None:
                out[p.name] = QuantSpec(p.fmt, p.shape)
    return out


def _entry(tag: str, shape: tuple[int, ...]) -> TensorInfo:
    numel = 1
    for d in shape:
        numel *= d
    return TensorInfo(dtype=tag, shape=shape, nbytes=numel * DTYPE_SIZES[tag])


def synthetic_headers(
    config: TextConfig, component: str, specs: dict[str, QuantSpec] | None = None
) -> dict[str, TensorInfo]:
    """The entries a synthetic `component` of `config` holds, as safetensors header entries: dense
    tensors, and the planes of those `specs` quantizes."""
    from ninfer.formats.registry import format_of
    from ninfer.formats.weight import plane_shapes

    shapes = expected_shapes(config, component)
    if shapes is None:
        raise ArtifactError(f"component {component!r} cannot have synthetic weights")
    specs = specs or {}
    out = {}
    for name, shape in with_splits(config, shapes, specs).items():
        spec = specs.get(name)
        if spec is None:
            out[name] = _entry(tensor_dtype(name), shape)
            continue
        fmt = format_of(spec.fmt)
        for plane, pshape in plane_shapes(spec.shape, fmt).items():
            out[quant_store.plane_name(name, plane)] = _entry(quant_store.PLANE_DTYPES[fmt.kind][plane], pshape)
    return out


def draw_tensor(
    name: str, shape: tuple[int, ...], dtype_tag: str, seed: int, device: str | torch.device, w8: bool = False
) -> torch.Tensor:
    """One synthetic tensor, drawn on `device` from a generator seeded by (seed, name), so every
    tensor is the same whatever the load order. Values keep a random model's activations finite:
    projections N(0, 0.02), 1+w norm offsets N(0, 0.1), plain-weight norms and dt_bias around 1,
    A = exp(A_log) uniform in [1, 16). A quantized tensor's plane (`NAME#plane`) is drawn by
    `_draw_plane` (`w8`: its base plane holds W8 codes)."""
    import torch

    gen = torch.Generator(device=device).manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    if quant_store.PLANE_SEP in name:
        return _draw_plane(name, shape, dtype_tag, gen, device, w8)
    dtype = torch.float32 if dtype_tag == "F32" else torch.bfloat16
    t = torch.empty(shape, dtype=dtype, device=device)
    if name.endswith("A_log"):
        return t.uniform_(1.0, 16.0, generator=gen).log_()
    t.normal_(0.0, 1.0, generator=gen)
    if name.endswith(("linear_attn.norm.weight", "linear_attn.dt_bias")):
        return t.mul_(0.1).add_(1.0)
    return t.mul_(0.1 if "norm" in name else 0.02)


def _draw_plane(
    name: str, shape: tuple[int, ...], dtype_tag: str, gen: torch.Generator, device: str | torch.device, w8: bool
) -> torch.Tensor:
    """A quantized tensor's plane: random code bytes (W8: -127..127, never -128); fp8 codes
    N(0, 1); scales that make the weights about N(0, 0.02) (groupwise: codes uniform over the
    format's range, so scale = 0.02 * sqrt(3) / qmax, taken at Q4's qmax 7 for every format: the
    weights are random, only their shapes and formats matter)."""
    import torch

    plane = name.rpartition(quant_store.PLANE_SEP)[2]
    if dtype_tag == "F8_E4M3":
        return torch.empty(shape, device=device).normal_(0.0, 1.0, generator=gen).to(torch.float8_e4m3fn)
    if plane == "scale":
        value = 0.02 if dtype_tag == "F32" else 0.02 * 3**0.5 / 7
        dtype = torch.float32 if dtype_tag == "F32" else torch.float16
        return torch.full(shape, value, dtype=dtype, device=device)
    lo, hi = (-127, 128) if plane == "base" and w8 else (0, 256)
    t = torch.randint(lo, hi, shape, generator=gen, device=device, dtype=torch.int16)
    return t.to(torch.int8).view(torch.uint8) if lo < 0 else t.to(torch.uint8)


def synthetic_spec(extra: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's `synthetic_weights` entry, checked, or None for an artifact with weight files."""
    spec = extra.get(SYNTHETIC_KEY)
    if spec is None:
        return None
    if (
        not isinstance(spec, dict)
        or not isinstance(spec.get("seed"), int)
        or isinstance(spec.get("seed"), bool)
    ):
        raise ArtifactError(f"manifest.json: {SYNTHETIC_KEY} must be an object with an integer 'seed'")
    return spec
