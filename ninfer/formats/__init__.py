"""Persistent weight formats: the groupwise integer formats (Q4 / Q5 / Q6 in groups of 64, W8 in
groups of 32) and block-scaled FP8, their encoders, packed planes and reference decoders, and the
`QuantWeight` the model and the kernels pass around. A leaf: imports nothing of ninfer.

`registry` needs no torch (artifact inspection stays light); `QuantWeight` is imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ninfer.formats.registry import FORMATS, WeightFormat, format_of, is_quantized

if TYPE_CHECKING:
    from ninfer.formats.weight import QuantWeight

__all__ = ["FORMATS", "QuantWeight", "WeightFormat", "format_of", "is_quantized"]


def __getattr__(name: str) -> Any:
    if name == "QuantWeight":
        from ninfer.formats.weight import QuantWeight

        return QuantWeight
    raise AttributeError(name)
