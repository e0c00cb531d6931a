"""Projections through `Ops.linear`, and groups of them that read one input fused into one weight."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ninfer.kernels.dispatch import Ops


def linear(ops: Ops | None, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T -> [..., N] through the backend's `linear` (None: torch)."""
    return F.linear(x, weight) if ops is None else ops.linear(x, weight)


def project(module: nn.Module, x: torch.Tensor, fused: str, parts: Sequence[str]) -> tuple[torch.Tensor, ...]:
    """The outputs of `module`'s projections `parts` on x [..., K], one tensor [..., N_i] each.

    Fused (`fuse_linears(module, fused, parts)` ran): one GEMM and views of its [..., sum N_i] output
    (strided, last dim contiguous); else one GEMM per part."""
    ops: Ops | None = getattr(module, "ops", None)
    sizes = _groups(module).get(fused)
    if sizes is None:
        return tuple(linear(ops, x, getattr(module, p).weight) for p in parts)
    return torch.split(linear(ops, x, getattr(module, fused)), sizes[1], dim=-1)


def fuse_linears(module: nn.Module, fused: str, parts: Sequence[str]) -> None:
    """Replace the bias-free `nn.Linear` submodules `parts` of `module` by one parameter `fused`,
    their weights concatenated by rows in order (values unchanged); the originals are freed.

    Peak extra memory: the group's weights once. `module.state_dict()` still names the parts
    (`{part}.weight`, row views of the fused weight) and `load_state_dict` accepts those names."""
    groups = _groups(module)
    if fused in groups:
        return
    linears = [getattr(module, p) for p in parts]
    for p, lin in zip(parts, linears, strict=True):
        if not isinstance(lin, nn.Linear) or lin.bias is not None:
            raise TypeError(f"{type(module).__name__}.{p}: only bias-free nn.Linear projections fuse")
    weight = torch.cat([lin.weight.detach() for lin in linears], dim=0)  # [sum N_i, K]
    sizes = tuple(lin.out_features for lin in linears)
    requires_grad = linears[0].weight.requires_grad
    del linears
    for p in parts:
        delattr(module, p)
    module.register_parameter(fused, nn.Parameter(weight, requires_grad=requires_grad))
    if not groups:
        module.register_state_dict_post_hook(_unfused_state)
        module.register_load_state_dict_pre_hook(_fuse_loaded_state)
    groups[fused] = (tuple(parts), sizes)
    module.fused_groups = groups


def is_fused(module: nn.Module, fused: str) -> bool:
    """Whether `fuse_linears(module, fused, ...)` ran (the parameter `fused` holds the group)."""
    return fused in _groups(module)


def _groups(module: nn.Module) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """fused parameter name -> (part names, part output sizes); empty when nothing is fused."""
    return module.__dict__.get("fused_groups", {})


def _unfused_state(module: nn.Module, state: dict, prefix: str, local_metadata: dict) -> None:
    """state_dict hook: a fused weight is saved under its parts' names (row views, no copy)."""
    for fused, (parts, sizes) in _groups(module).items():
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
    for fused, (parts, _) in _groups(module).items():
        names = [f"{prefix}{p}.weight" for p in parts]
        if all(n in state for n in names):
            state[prefix + fused] = torch.cat([state.pop(n) for n in names], dim=0)
