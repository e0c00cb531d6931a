"""Counts kernel compilations in this process: Triton JIT specializations (autotuning included)
and torch.compile graphs.

A server must compile everything a request can reach before it says ready; anything compiled
afterwards is a latency outlier some user paid for. `install()` chains a Triton `jit_cache_hook`
(called once per new in-memory specialization, before it is compiled or read from the disk cache)
and `count()` adds Dynamo's compiled-graph count, so the engine can record compilations after
ready per request and in total. On the CPU (the Triton interpreter, no torch.compile) it stays 0.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from typing import Any

_lock = threading.Lock()
_names: Counter[str] = Counter()  # kernel name -> specializations compiled in this process
_installed = False


def install() -> None:
    """Start counting Triton compilations (idempotent; keeps a hook installed before it)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    try:
        from triton import knobs
    except ImportError:  # no Triton: nothing can compile through it
        return
    previous = knobs.runtime.jit_cache_hook

    def hook(*args: Any, **kwargs: Any) -> bool | None:
        fn = kwargs.get("fn")
        name = getattr(fn, "name", None) or "triton"
        with _lock:
            _names[str(name)] += 1
        return previous(*args, **kwargs) if previous is not None else None

    knobs.runtime.jit_cache_hook = hook


def record(name: str) -> None:
    """Count one compilation by hand (a backend whose compiler has no hook)."""
    with _lock:
        _names[name] += 1


def _dynamo_graphs() -> int:
    if "torch._dynamo" not in sys.modules:
        return 0  # nothing was compiled through Dynamo (importing it to ask costs ~2 s)
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


def count() -> int:
    """Kernels and graphs compiled in this process so far."""
    with _lock:
        total = sum(_names.values())
    return total + _dynamo_graphs()


def by_name() -> dict[str, int]:
    """Triton specializations per kernel name (for a report of what compiled late)."""
    with _lock:
        return dict(_names)
