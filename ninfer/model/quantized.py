"""Modules over quantized weights (`ninfer.formats.QuantWeight`): a projection, an embedding, and
the load-time placement of quantized tensors into a model built for dense ones.

A quantized weight is held as a plain attribute `weight` (not a parameter: it is several planes of
other dtypes), so `state_dict` lists only the dense tensors; `projections.linear` sends a
`QuantWeight` through `Ops.qlinear`."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ninfer.formats import QuantWeight
from ninfer.kernels import quant_ref
from ninfer.kernels.dispatch import Ops
from ninfer.model.config import TextConfig
from ninfer.model.layout import SPLIT_Q, SPLIT_QKV, SPLITS


class QuantLinear(nn.Module):
    """A bias-free projection y = x @ W^T over a quantized W [N, K]."""

    def __init__(self, weight: QuantWeight, ops: Ops | None = None) -> None:
        super().__init__()
        if len(weight.shape) != 2:
            raise ValueError(f"a projection's weight is [N, K]; got {weight.shape}")
        self.weight = weight
        self.ops = ops  # the backend whose qlinear `forward` runs (None: the reference)
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        return quant_ref.qlinear(x, self.weight) if self.ops is None else self.ops.qlinear(x, self.weight)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.weight.fmt.name}"


class QuantEmbedding(nn.Module):
    """Token embedding over a quantized table [V, H]: the looked-up rows dequantized to `dtype`."""

    def __init__(self, weight: QuantWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = weight
        self.dtype = dtype
        self.num_embeddings, self.embedding_dim = weight.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [...] int64 -> [..., H]
        return self.weight.dequantize_rows(ids, self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings} x {self.embedding_dim}, {self.weight.fmt.name}"


def split_rows(config: TextConfig, whole: str) -> dict[str, torch.Tensor] | None:
    """A splittable tensor's parts: part name -> the rows [n_i] of the whole they take (in order);
    None when `whole` does not split. q_proj: each head's first head_dim rows are its query, the
    next head_dim its output gate; in_proj_qkv: [q | k] then v."""
    for suffix, parts in SPLITS:
        if whole.endswith(suffix):
            prefix = whole.removesuffix(suffix)
            if suffix == SPLIT_Q[0]:
                nh, hd = config.num_attention_heads, config.head_dim
                heads = torch.arange(nh).unsqueeze(1) * 2 * hd
                query = (heads + torch.arange(hd)).reshape(-1)
                rows = [query, query + hd]
            else:
                qk = 2 * config.key_dim
                rows = [torch.arange(qk), torch.arange(qk, config.conv_dim)]
            return {prefix + p: r for p, r in zip(parts, rows, strict=True)}
    return None


def merge_rows(config: TextConfig, whole: str, parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The inverse of `split_rows`: the whole [N, K] from its parts' (dense) rows."""
    rows = split_rows(config, whole)
    if rows is None:
        raise ValueError(f"{whole} does not split")
    first = next(iter(parts.values()))
    n = sum(len(r) for r in rows.values())
    out = first.new_empty((n, first.shape[-1]))
    for name, r in rows.items():
        out[r] = parts[name]
    return out


class PlacementError(ValueError):
    """A quantized tensor does not fit the model: unknown name, wrong kind of module, wrong shape."""


def split_names(names: set[str] | Mapping[str, object], prefix: str) -> tuple[bool, bool]:
    """(query and gate split, GDN q|k and v split) for the decoder layers under `prefix` (`model.`,
    `mtp.`): whether the tensors name the parts instead of the whole (a quantized artifact splits a
    projection whose rows take two formats). Every layer of a kind must agree."""
    return _split(names, prefix, SPLIT_Q), _split(names, prefix, SPLIT_QKV)


def _split(names: set[str] | Mapping[str, object], prefix: str, rule: tuple[str, tuple[str, ...]]) -> bool:
    whole, parts = rule
    found = {n for n in names if n.startswith(prefix) and n.endswith(whole)}
    split = {n for n in names if n.startswith(prefix) and n.endswith(parts[0])}
    if found and split:
        raise PlacementError(f"{prefix}*: some layers store {whole}, others its parts {list(parts)}")
    return bool(split)


def place(
    module: nn.Module, tensors: Mapping[str, QuantWeight], device: torch.device, dtype: torch.dtype
) -> None:
    """Put each quantized tensor (parameter names relative to `module`) where the dense parameter of
    that name is: an `nn.Linear` becomes a `QuantLinear`, an `nn.Embedding` a `QuantEmbedding`, an
    expert bank's parameter becomes the `QuantWeight` itself. Shapes must match the dense ones."""
    for name, qw in tensors.items():
        path, _, attr = name.rpartition(".")
        try:
            owner = module.get_submodule(path)
        except AttributeError:
            raise PlacementError(f"quantized tensor {name!r}: no module {path!r}") from None
        current = getattr(owner, attr, None)
        if not isinstance(current, torch.Tensor):
            raise PlacementError(f"quantized tensor {name!r}: {path!r} has no dense {attr!r}")
        if tuple(current.shape) != qw.shape:
            raise PlacementError(
                f"quantized tensor {name!r}: shape {list(qw.shape)}, model wants {list(current.shape)}"
            )
        qw = qw.to(device)
        parent_path, _, child = path.rpartition(".")
        parent = module.get_submodule(parent_path) if parent_path else module
        if isinstance(owner, nn.Linear) and attr == "weight" and owner.bias is None:
            setattr(parent, child, QuantLinear(qw, getattr(parent, "ops", None)))
        elif isinstance(owner, nn.Embedding) and attr == "weight":
            setattr(parent, child, QuantEmbedding(qw, dtype))
        elif len(qw.shape) == 3:  # an expert bank held as a parameter of its module
            delattr(owner, attr)
            setattr(owner, attr, qw)
        else:
            raise PlacementError(f"quantized tensor {name!r}: {type(owner).__name__} cannot hold it")


def quantized_weights(module: nn.Module) -> list[QuantWeight]:
    """Every `QuantWeight` held by `module` and its submodules (each once)."""
    seen: dict[int, QuantWeight] = {}
    for m in module.modules():
        for v in vars(m).values():
            if isinstance(v, QuantWeight):
                seen.setdefault(id(v), v)
    return list(seen.values())
