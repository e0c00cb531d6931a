"""Argument checks shared by the Triton op wrappers (host-side, no device synchronisation)."""

from __future__ import annotations

import torch
from triton import knobs


def check_devices(*tensors: torch.Tensor) -> None:
    """All tensors on one device; CPU tensors only when the kernels were built for the interpreter."""
    device = tensors[0].device
    for x in tensors[1:]:
        if x.device != device:
            raise ValueError(f"tensors on different devices: {device} and {x.device}")
    if device.type == "cpu" and not knobs.runtime.interpret:
        raise RuntimeError(
            "Triton kernels got CPU tensors but were not built for the interpreter: set "
            "TRITON_INTERPRET=1 before importing ninfer.kernels.triton (or pass CUDA tensors)"
        )


def check_int_index(name: str, x: torch.Tensor) -> None:
    if x.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64; got {x.dtype}")


def last_dim_contiguous(**tensors: torch.Tensor) -> None:
    for name, x in tensors.items():
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim (stride {x.stride()})")
