"""Transitional: the engine's seam types moved to `ninfer.engine.types` (an `api` module inside
`ninfer.engine` read as the HTTP `ninfer.api` package). The scripts in ops/bench still import
these names from here; this module goes once they import them from `ninfer.engine.types`."""

from ninfer.engine.types import ConstraintSpec, GenerationRequest, SamplingParams

__all__ = ["ConstraintSpec", "GenerationRequest", "SamplingParams"]
