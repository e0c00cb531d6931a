"""Programmatic dependent launch (PDL) for the decode kernels (sm_90 and newer).

A decode step is hundreds of short kernels in a row; each one's ramp-up (launch, block
dispatch, the first loads' DRAM latency) and tail would otherwise sit between two kernels.
Launched with PDL (`launch_pdl=True`), a kernel may start once every block of the kernel before
it has called `griddepcontrol.launch_dependents`; it then waits in `griddepcontrol.wait` until
that kernel has completed and its writes are visible. Every kernel here triggers its dependents
first thing (`pdl_trigger`) and reads nothing another kernel wrote, and writes nothing, before
`pdl_wait`; a kernel with loads that depend on nothing before it (the GEMV's weight tiles) issues
them in between. A kernel launched without PDL (a torch op, a copy) still waits for the whole
previous kernel, and the wait is a no-op when the launch was not programmatic, so mixing is safe.
CUDA graphs capture PDL launches as programmatic edges.

`launch(t)` gives a launch site's keyword arguments: on for CUDA tensors on sm_90+ unless
`NINFER_PDL=0` (an escape hatch, and the benchmark's A/B switch) or inside `pdl_allowed(False)`;
off on the CPU interpreter; the engine's single-token steps launch without it
(`ninfer.kernels.launch_scope`, with the measurements).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ninfer.kernels.launch_scope import pdl_permitted

ENV = "NINFER_PDL"
_FROM_ENV = os.environ.get(ENV, "1") != "0"  # read once: every decode kernel launch asks
_ON = {"PDL": True, "launch_pdl": True}
_OFF = {"PDL": False, "launch_pdl": False}


@triton.jit
def pdl_trigger(PDL: tl.constexpr):
    """Let the next kernel (if launched with PDL) start dispatching its blocks."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Block until the previous kernel completed and its writes are visible."""
    if PDL:
        gdc_wait()


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """`pdl_trigger` then `pdl_wait`: the opening of a kernel with nothing to load early."""
    pdl_trigger(PDL)
    pdl_wait(PDL)


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def enabled(t: torch.Tensor) -> bool:
    """Whether kernels on t's device launch with PDL (`NINFER_PDL` as the process started)."""
    if t.device.type != "cuda" or not _FROM_ENV or not pdl_permitted():
        return False
    return _capable(t.device.index if t.device.index is not None else torch.cuda.current_device())


def launch(t: torch.Tensor) -> dict[str, bool]:
    """Keyword arguments of a launch whose kernel takes a `PDL` constexpr (see module doc)."""
    return _ON if enabled(t) else _OFF
