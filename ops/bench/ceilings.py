"""Hardware ceilings: device copy bandwidth and matrix-product peak (timed on any device)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

GiB = 1024**3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, reps: int, warmup: int) -> float:
    """Median wall seconds of `fn` (synchronized on `device`) over `reps` runs after `warmup`."""
    times = []
    for i in range(warmup + reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth_TBps(device: str, nbytes: int, reps: int = 20) -> float:
    """Copy of `nbytes` of bf16 on `device`, counting bytes read plus bytes written (median)."""
    dev = torch.device(device)
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    secs = median_seconds(lambda: dst.copy_(src), dev, reps, 5)
    return 2 * src.numel() * 2 / secs / 1e12


def matmul_peak_TFLOPs(device: str, n: int, dtype: torch.dtype, reps: int = 20) -> float:
    """n x n x n matrix product on random data in `dtype` (median)."""
    dev = torch.device(device)
    a = torch.randn(n, n, dtype=dtype, device=dev)
    b = torch.randn(n, n, dtype=dtype, device=dev)
    secs = median_seconds(lambda: a @ b, dev, reps, 5)
    return 2 * n**3 / secs / 1e12
