"""Artifacts of a released model's shapes whose weights are drawn at load time (no weight files).

`python -m ninfer.artifact synth --shape qwen3.6-27b OUT` writes the manifest, config, tokenizer,
template and generation file of a released shape, and records in the manifest (`synthetic_weights`)
that every tensor is drawn from a seed when it is loaded: on the device, in the model's dtype, in
seconds. The whole service then runs at full size on a machine with a small disk; what it generates
is not meaningful. The reader (`reader.Artifact.load_tensors`) does the drawing (`synth_draw.py`); `inspect`, the
server log and `/v1/models` say that the weights are synthetic.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ninfer.artifact import profiles, quant_store, registry
from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.manifest import ArtifactIdentity, Component
from ninfer.artifact.quant_store import QuantSpec
from ninfer.artifact.released import RELEASED_GENERATION, RELEASED_SHAPES
from ninfer.artifact.shapes import expected_shapes
from ninfer.artifact.synth_draw import SYNTHETIC_KEY, synthetic_headers
from ninfer.model.config import TextConfig

if TYPE_CHECKING:
    from ninfer.artifact.writer import ArtifactWriter


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
