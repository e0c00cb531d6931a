"""Build the model and the MTP head from canonical tensor names, with strict name and shape checks."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ninfer.formats import QuantWeight
from ninfer.kernels.dispatch import Ops, get_ops
from ninfer.model.config import TextConfig
from ninfer.model.mtp import MTPHead
from ninfer.model.quantized import PlacementError, place, split_names
from ninfer.model.qwen35 import Qwen35Model

Tensors = Mapping[str, "torch.Tensor | QuantWeight"]

MTP_PREFIX = "mtp."


class WeightError(ValueError):
    """Tensors do not match the model: missing, unexpected or mis-shaped names."""


def _canonical_to_param(name: str) -> str:
    """`model.X` -> `X` (trunk modules sit at the top of Qwen35Model); `lm_head.weight` unchanged."""
    return name[len("model.") :] if name.startswith("model.") else name


def _assign(module: nn.Module, tensors: Tensors, to_param, what: str, dtype, device) -> None:
    """Quantized tensors into their modules (`quantized.place`), then every dense one by name and
    shape (strict: none missing, none unexpected)."""
    quant = {to_param(k): v for k, v in tensors.items() if isinstance(v, QuantWeight)}
    try:
        place(module, quant, torch.device(device), dtype)
    except PlacementError as err:
        raise WeightError(f"{what}: {err}") from None
    tensors = {k: v for k, v in tensors.items() if not isinstance(v, QuantWeight)}
    expected = {k: tuple(v.shape) for k, v in module.state_dict(keep_vars=True).items()}
    given = {to_param(k): k for k in tensors}
    missing = sorted(set(expected) - set(given))
    extra = sorted(given[k] for k in set(given) - set(expected))
    bad = sorted(
        f"{given[k]}: {tuple(tensors[given[k]].shape)} != expected {expected[k]}"
        for k in set(expected) & set(given)
        if tuple(tensors[given[k]].shape) != expected[k]
    )
    if missing or extra or bad:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)}: {missing[:8]}")
        if extra:
            parts.append(f"unexpected {len(extra)}: {extra[:8]}")
        if bad:
            parts.append(f"mis-shaped {len(bad)}: {bad[:8]}")
        raise WeightError(f"{what} weights do not match the config: " + "; ".join(parts))
    sd = {k: tensors[given[k]].to(device=device, dtype=dtype) for k in expected}
    module.load_state_dict(sd, strict=True, assign=True)


def fuse_default(device: torch.device | str) -> bool:
    """Whether a model on `device` runs with fused projections: on CUDA (fewer, larger GEMMs per
    decode layer); not on the CPU, where loads map the artifact's tensors without copying them."""
    return torch.device(device).type == "cuda"


def load_model(
    config: TextConfig,
    tensors: Tensors,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    ops: Ops | None = None,
    fuse: bool | None = None,
    consume: bool = False,
) -> Qwen35Model:
    """Build `Qwen35Model` from canonical names (`model.*`, `lm_head.weight`); every tensor is cast to `dtype`
    (as transformers does). Tensors named `mtp.*`, if present, become the MTP head (`load_mtp`).

    fuse: concatenate the projections that read one input (`Qwen35Model.fuse_projections`);
    None = on CUDA only (a CPU load keeps the tensors it was given, e.g. mmapped, uncopied).
    Quantized tensors (`QuantWeight`) are held as they are: dense tensors are cast, planes are not;
    an artifact that splits query / gate or GDN q|k / v (`quantized.split_names`) gets the split
    layers.

    consume: empty `tensors` once the model holds them, so that fusing frees each part as its fused
    weight is built (the loader's dict would otherwise keep every part alive: a 27B groupwise-int
    load on the GPU peaked at its weights plus every fused copy, 25.7 GB for 16.4 GB of weights)."""
    device = torch.device(device)
    ops = ops or get_ops(device.type)
    text = {k: v for k, v in tensors.items() if not k.startswith(MTP_PREFIX)}
    mtp = {k: v for k, v in tensors.items() if k.startswith(MTP_PREFIX)}
    with torch.device("meta"):
        model = Qwen35Model(config, ops)
        try:
            model.split_projections(*split_names(text, "model."))
        except PlacementError as err:
            raise WeightError(f"text model: {err}") from None
    _assign(model, text, _canonical_to_param, "text model", dtype, device)
    if consume:
        text.clear()
        if isinstance(tensors, dict):
            tensors.clear()
    model.init_buffers(device)
    model.eval().requires_grad_(False)
    if fuse_default(device) if fuse is None else fuse:
        model.fuse_projections()
    if mtp:
        load_mtp(config, mtp, model, dtype, device, fuse)
    model.reserve_quantized()
    return model


def load_mtp(
    config: TextConfig,
    tensors: Tensors,
    model: Qwen35Model,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    fuse: bool | None = None,
) -> MTPHead:
    """Build the MTP head from `mtp.*` tensors, bind it to `model`'s embedding/lm_head, set `model.mtp`;
    fuse its projections as `load_model` does (None = on CUDA only)."""
    others = sorted(k for k in tensors if not k.startswith(MTP_PREFIX))
    if others:
        raise WeightError(f"MTP weights must be named mtp.*; got {others[:8]}")
    with torch.device("meta"):
        head = MTPHead(config, model.ops)
        try:
            query_gate, _ = split_names(tensors, "mtp.")
        except PlacementError as err:
            raise WeightError(f"MTP head: {err}") from None
        if query_gate:
            head.layers[0].self_attn.split_query_gate()
    _assign(head, tensors, lambda k: k[len(MTP_PREFIX) :], "MTP head", dtype, torch.device(device))
    head.eval().requires_grad_(False)
    if fuse_default(device) if fuse is None else fuse:
        head.fuse_projections()
    assert model.rotary is not None
    head.bind(model.embed_tokens, model.lm_head, model.rotary)
    head.layer_steps = model.layer_steps  # compiled layer steps installed before the head loaded
    model.mtp = head
    model.reserve_quantized()
    return head
