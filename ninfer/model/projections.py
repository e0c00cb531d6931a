"""Projections through `Ops.linear` (dense weights) or `Ops.qlinear` (`QuantWeight`s), and groups of
them that read one input fused into one weight."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ninfer.formats import QuantWeight
from ninfer.formats.weight import can_cat, cat_rows
from ninfer.kernels import quant_ref
from ninfer.kernels.dispatch import Ops
from ninfer.model.quantized import QuantLinear

Weight = torch.Tensor | QuantWeight


def linear(ops: Ops | None, x: torch.Tensor, weight: Weight) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T -> [..., N] through the backend's `linear`, or `qlinear` for a
    quantized weight (None: torch, the reference dequantization)."""
    if isinstance(weight, QuantWeight):
        return quant_ref.qlinear(x, weight) if ops is None else ops.qlinear(x, weight)
    return F.linear(x, weight) if ops is None else ops.linear(x, weight)


@dataclass(frozen=True)
class FusedGroup:
    """Projections of one module fused into one weight: which call (`family`), parts, output sizes."""

    family: str  # the `fused` name given to `fuse_linears` / `project`
    parts: tuple[str, ...]
    sizes: tuple[int, ...]


def project(module: nn.Module, x: torch.Tensor, fused: str, parts: Sequence[str]) -> tuple[torch.Tensor, ...]:
    """The outputs of `module`'s projections `parts` on x [..., K], one tensor [..., N_i] each.

    Each fused group of `fused` (`fuse_linears(module, fused, parts)` ran) is one GEMM, its parts views
    of the [..., sum N_i] output (strided, last dim contiguous); other parts one GEMM each."""
    ops: Ops | None = getattr(module, "ops", None)
    out: dict[str, torch.Tensor] = {}
    for name, g in _groups(module).items():
        if g.family == fused:
            out.update(zip(g.parts, torch.split(linear(ops, x, getattr(module, name)), g.sizes, dim=-1), strict=True))
    return tuple(out[p] if p in out else linear(ops, x, getattr(module, p).weight) for p in parts)


def fuse_linears(module: nn.Module, fused: str, parts: Sequence[str]) -> None:
    """Replace runs of consecutive projections `parts` of `module` that share a weight format (bias-free
    `nn.Linear`s of one dtype, or `QuantLinear`s of one format) by one weight each, rows concatenated in
    order (values unchanged); the originals are freed. One run covering every part is named `fused`
    (a parameter, or a plain `QuantWeight` attribute); several runs `fused_0`, `fused_1`, ... (a run of
    one part stays as it is).

    Peak extra memory: a group's weights once. `module.state_dict()` still names the dense parts
    (`{part}.weight`, row views of a fused weight) and `load_state_dict` accepts those names."""
    groups = _groups(module)
    if any(g.family == fused for g in groups.values()):
        return
    linears = [getattr(module, p) for p in parts]
    for p, lin in zip(parts, linears, strict=True):
        if not (isinstance(lin, QuantLinear) or (isinstance(lin, nn.Linear) and lin.bias is None)):
            raise TypeError(f"{type(module).__name__}.{p}: only bias-free projections fuse")
    runs = _runs(list(parts), linears)
    for i, run in enumerate(runs):
        if len(run) < 2:
            continue
        name = fused if len(runs) == 1 else f"{fused}_{i}"
        mods = [getattr(module, p) for p in run]
        sizes = tuple(m.out_features for m in mods)
        if isinstance(mods[0], QuantLinear):
            qw = cat_rows([m.weight for m in mods])
            for p in run:
                delattr(module, p)
            setattr(module, name, qw)
        else:
            weight = torch.cat([m.weight.detach() for m in mods], dim=0)  # [sum N_i, K]
            requires_grad = mods[0].weight.requires_grad
            for p in run:
                delattr(module, p)
            module.register_parameter(name, nn.Parameter(weight, requires_grad=requires_grad))
        del mods
        if not groups:
            module.register_state_dict_post_hook(_unfused_state)
            module.register_load_state_dict_pre_hook(_fuse_loaded_state)
        groups[name] = FusedGroup(fused, tuple(run), sizes)
    module.fused_groups = groups


def _runs(parts: list[str], linears: list[nn.Module]) -> list[list[str]]:
    """Maximal runs of consecutive parts whose weights concatenate (one dtype, or one format)."""
    runs: list[list[str]] = []
    prev: nn.Module | None = None
    for p, lin in zip(parts, linears, strict=True):
        if prev is not None and _joins(prev, lin):
            runs[-1].append(p)
        else:
            runs.append([p])
        prev = lin
    return runs


def _joins(a: nn.Module, b: nn.Module) -> bool:
    if isinstance(a, QuantLinear) and isinstance(b, QuantLinear):
        return can_cat([a.weight, b.weight])
    if isinstance(a, QuantLinear) or isinstance(b, QuantLinear):
        return False
    return a.weight.dtype == b.weight.dtype and a.in_features == b.in_features


def is_fused(module: nn.Module, fused: str) -> bool:
    """Whether all of `fused`'s parts went into one weight named `fused` (`fuse_linears` ran)."""
    g = _groups(module).get(fused)
    return g is not None and g.family == fused


def _groups(module: nn.Module) -> dict[str, FusedGroup]:
    """fused weight name -> its group; empty when nothing is fused."""
    return module.__dict__.get("fused_groups", {})


def _unfused_state(module: nn.Module, state: dict, prefix: str, local_metadata: dict) -> None:
    """state_dict hook: a fused dense weight is saved under its parts' names (row views, no copy)."""
    for fused, g in _groups(module).items():
        parts, sizes = g.parts, g.sizes
        weight = state.pop(prefix + fused, None)
        if weight is None:
            continue
        for p, w in zip(parts, torch.split(weight, sizes, dim=0), strict=True):
            state[f"{prefix}{p}.weight"] = w


def _fuse_loaded_state(
    module: nn.Module,
    state: dict,
    prefix: str,
    local_metadata: dict,
    strict: bool,
    missing_keys: list,
    unexpected_keys: list,
    error_msgs: list,
) -> None:
    """load_state_dict pre-hook: the parts' weights, when all are given, load into the fused weight."""
    for fused, g in _groups(module).items():
        names = [f"{prefix}{p}.weight" for p in g.parts]
        if all(n in state for n in names):
            state[prefix + fused] = torch.cat([state.pop(n) for n in names], dim=0)
