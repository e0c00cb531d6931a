"""Which weight formats the CUDA kernels run on which GPUs (the CPU reference runs every format).

Groupwise Q4 / Q5 / Q6 / W8 decode with integer and bit operations: every GPU Triton runs on. fp8
(e4m3fn) codes are converted by Triton's fp8 support, which needs compute capability 8.9 (Ada,
Hopper and newer); the kernels use fp8 as a weight-only format, so no fp8 tensor-core math is
required."""

from __future__ import annotations

MIN_CAPABILITY: dict[str, tuple[int, int]] = {"fp8_e4m3_b128": (8, 9)}


def unsupported(formats: set[str], capability: tuple[int, int] | None) -> str | None:
    """Why a GPU of `capability` (None: no GPU, the reference runs) cannot run `formats`, or None."""
    if capability is None:
        return None
    for fmt in sorted(formats):
        need = MIN_CAPABILITY.get(fmt)
        if need is not None and capability < need:
            return (
                f"weight format {fmt} needs a GPU of compute capability {need[0]}.{need[1]} or newer "
                f"(this one is {capability[0]}.{capability[1]}); convert the checkpoint with "
                "--weights groupwise-int or bf16"
            )
    return None
