"""Synthetic weights drawn at load: the header entries a synthetic component holds, each tensor's
draw (on the device, from a seed and its name) and the manifest's `synthetic_weights` entry.

What the reader needs of a synthetic artifact, apart from writing one (`synth.py`).
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any

from ninfer.artifact import quant_store
from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.files import DTYPE_SIZES, TensorInfo
from ninfer.artifact.quant_store import QuantSpec
from ninfer.artifact.shapes import expected_shapes, with_splits
from ninfer.model.config import TextConfig

if TYPE_CHECKING:
    import torch

SYNTHETIC_KEY = "synthetic_weights"  # manifest.json top-level key: {"seed": int, "dtype": str}
WEIGHT_DTYPE = "BF16"  # the released checkpoints' dtype (A_log is F32 there too)


def tensor_dtype(name: str) -> str:
    """The safetensors dtype tag a released checkpoint stores `name` in."""
    return "F32" if name.endswith("A_log") else WEIGHT_DTYPE


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
            out[quant_store.plane_name(name, plane)] = _entry(
                quant_store.PLANE_DTYPES[fmt.kind][plane], pshape
            )
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
    name: str,
    shape: tuple[int, ...],
    dtype_tag: str,
    gen: torch.Generator,
    device: str | torch.device,
    w8: bool,
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
