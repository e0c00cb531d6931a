"""NInfer: an LLM inference server for the Qwen3.5 / Qwen3.6 / Qwen3.8 hybrid family."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ninfer.version import __version__

__all__ = ["LLM", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from ninfer.engine.types import SamplingParams
    from ninfer.offline import LLM


def __getattr__(name: str) -> Any:  # lazy: importing ninfer must not import torch
    if name == "LLM":
        from ninfer.offline import LLM

        return LLM
    if name == "SamplingParams":
        from ninfer.engine.types import SamplingParams

        return SamplingParams
    raise AttributeError(name)
