"""Quantized tensors in an artifact: each is stored as its planes (`NAME#base`, `NAME#high`,
`NAME#scale`, safetensors entries beside the dense tensors) and described in the manifest:

    "weight_formats": {"profile": "groupwise-int",
                       "tensors": {"text": {"lm_head.weight": {"format": "q6_g64", "shape": [V, H]}, ...},
                                   "mtp": {...}}}

Opening checks every described tensor's planes (names, dtypes, shapes) against its format; loading
assembles them into `QuantWeight`s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.files import TensorInfo
from ninfer.formats.registry import FORMATS, PLANE_SEP, format_of, plane_shapes

if TYPE_CHECKING:
    import torch

    from ninfer.formats import QuantWeight

KEY = "weight_formats"
# safetensors dtype of each plane, by format kind
PLANE_DTYPES = {
    "groupwise": {"base": "U8", "high": "U8", "scale": "F16"},
    "fp8": {"base": "F8_E4M3", "scale": "F32"},
}


@dataclass(frozen=True)
class QuantSpec:
    """One quantized logical tensor: format name and logical shape."""

    fmt: str
    shape: tuple[int, ...]


def parse(extra: dict[str, Any]) -> tuple[str, dict[str, dict[str, QuantSpec]]]:
    """(profile, component -> name -> spec) from the manifest's extra keys; ("bf16", {}) when absent."""
    d = extra.get(KEY)
    if d is None:
        return "bf16", {}
    if (
        not isinstance(d, dict)
        or not isinstance(d.get("profile"), str)
        or not isinstance(d.get("tensors"), dict)
    ):
        raise ArtifactError(f"manifest.json: {KEY} must be an object with 'profile' and 'tensors'")
    out: dict[str, dict[str, QuantSpec]] = {}
    for comp, entries in d["tensors"].items():
        if not isinstance(entries, dict):
            raise ArtifactError(f"manifest.json: {KEY}.tensors.{comp} is not an object")
        out[comp] = {}
        for name, e in entries.items():
            fmt, shape = (e.get("format"), e.get("shape")) if isinstance(e, dict) else (None, None)
            if fmt not in FORMATS:
                raise ArtifactError(
                    f"manifest.json: {name}: unknown weight format {fmt!r}; known: {', '.join(FORMATS)}"
                )
            if not isinstance(shape, list) or not all(isinstance(s, int) and s > 0 for s in shape):
                raise ArtifactError(f"manifest.json: {name}: shape must be a list of positive integers")
            out[comp][name] = QuantSpec(fmt, tuple(shape))
    return d["profile"], out


def manifest_entry(profile: str, specs: dict[str, dict[str, QuantSpec]]) -> dict[str, Any]:
    return {
        "profile": profile,
        "tensors": {
            comp: {n: {"format": s.fmt, "shape": list(s.shape)} for n, s in sorted(entries.items())}
            for comp, entries in specs.items()
        },
    }


def with_component(
    extra: dict[str, Any], component: str, specs: dict[str, QuantSpec], profile: str
) -> dict[str, Any]:
    """The manifest's extra keys with `component`'s quantized tensors replaced by `specs` (a
    component added to an existing artifact: the proposal head)."""
    prof, all_specs = parse(extra)
    all_specs = {c: v for c, v in all_specs.items() if c != component}
    if specs:
        all_specs[component] = specs
    out = {k: v for k, v in extra.items() if k != KEY}
    if all_specs:
        out[KEY] = manifest_entry(prof if prof != "bf16" else profile, all_specs)
    return out


def plane_name(name: str, plane: str) -> str:
    return f"{name}{PLANE_SEP}{plane}"


def logical_headers(
    component: str, physical: dict[str, TensorInfo], specs: dict[str, QuantSpec]
) -> dict[str, TensorInfo]:
    """The component's tensors as the model sees them: dense entries as stored, each quantized
    tensor once under its own name (dtype: the format name, nbytes: its planes'). Every plane is
    checked; a plane without a manifest entry or an entry without its planes is refused."""
    out = {n: i for n, i in physical.items() if PLANE_SEP not in n}
    planes = {n for n in physical if PLANE_SEP in n}
    for name, spec in specs.items():
        fmt = format_of(spec.fmt)
        try:
            want = plane_shapes(spec.shape, fmt)
        except ValueError as err:
            raise ArtifactError(f"component {component!r}: {name}: {err}") from None
        nbytes = 0
        for plane, shape in want.items():
            key = plane_name(name, plane)
            info = physical.get(key)
            if info is None:
                raise ArtifactError(
                    f"component {component!r}: {name} ({fmt.name}) lacks its {plane} plane {key!r}"
                )
            dtype = PLANE_DTYPES[fmt.kind][plane]
            if info.dtype != dtype or info.shape != shape:
                raise ArtifactError(
                    f"component {component!r}: plane {key}: {info.dtype} {list(info.shape)}, "
                    f"{fmt.name} {list(spec.shape)} needs {dtype} {list(shape)}"
                )
            planes.discard(key)
            nbytes += info.nbytes
        if name in out:
            raise ArtifactError(f"component {component!r}: {name} is stored both dense and quantized")
        out[name] = TensorInfo(dtype=fmt.name, shape=spec.shape, nbytes=nbytes)
    if planes:
        raise ArtifactError(
            f"component {component!r}: plane {sorted(planes)[0]!r} has no weight_formats entry"
        )
    return out


def assemble(
    tensors: dict[str, torch.Tensor], specs: dict[str, QuantSpec]
) -> dict[str, torch.Tensor | QuantWeight]:
    """Loaded entries -> dense tensors and `QuantWeight`s by logical name."""
    from ninfer.formats.weight import from_planes

    out: dict[str, torch.Tensor | QuantWeight] = {n: t for n, t in tensors.items() if PLANE_SEP not in n}
    for name, spec in specs.items():
        fmt = format_of(spec.fmt)
        planes = {p: tensors[plane_name(name, p)] for p in plane_shapes(spec.shape, fmt)}
        out[name] = from_planes(fmt, spec.shape, planes)
    return out
