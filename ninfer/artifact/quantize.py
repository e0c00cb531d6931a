"""A dense checkpoint tensor under a weight profile: itself, quantized, or its quantized parts."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ninfer.artifact import profiles
from ninfer.artifact.errors import ArtifactError
from ninfer.formats import QuantWeight
from ninfer.formats.weight import quantize
from ninfer.model.config import TextConfig
from ninfer.model.quantized import split_rows


def store_as(
    profile: str, config: TextConfig, model_id: str, name: str, t: torch.Tensor
) -> list[tuple[str, torch.Tensor | QuantWeight]]:
    """What an artifact of `profile` holds for canonical tensor `name` (text / MTP): (name, tensor or
    QuantWeight) pairs, the parts of a split projection in their order."""
    out: list[tuple[str, torch.Tensor | QuantWeight]] = []
    for p in profiles.plan(profile, config, model_id, name, tuple(t.shape)):
        part = t
        if p.whole is not None:
            rows = split_rows(config, name)
            assert rows is not None
            part = t[rows[p.name]]
        if p.fmt is None or not part.is_floating_point():
            out.append((p.name, part))
            continue
        try:
            out.append((p.name, quantize(part, p.fmt)))
        except ValueError as err:
            raise ArtifactError(f"{p.name}: {err}") from None
    return out


def quantize_tensors(
    profile: str, config: TextConfig, model_id: str, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor | QuantWeight]:
    """Every tensor of a canonical mapping under `profile` (tests and benchmarks build models so)."""
    out: dict[str, torch.Tensor | QuantWeight] = {}
    for name, t in tensors.items():
        out.update(store_as(profile, config, model_id, name, t))
    return out
