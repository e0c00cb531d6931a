"""Persistent compile caches: Inductor and Triton kernels kept under compile_cache/ between starts."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("ninfer.service.compile_cache")

ENV_ROOT = "NINFER_COMPILE_CACHE"  # overrides the default <repository>/compile_cache
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "compile_cache"


def count_files(path: Path) -> int:
    """Regular files below `path` (0 when it does not exist)."""
    return sum(len(files) for _, _, files in os.walk(path))


@dataclass
class CompileCache:
    """Where the caches live and what was there at start (files present = possible cache hits)."""

    root: Path
    inductor_dir: Path
    triton_dir: Path
    inductor_files_at_start: int
    triton_files_at_start: int
    t_start: float = field(default_factory=time.perf_counter)

    @property
    def warm(self) -> bool:
        return self.inductor_files_at_start + self.triton_files_at_start > 0

    def report(self, compile_s: float | None = None) -> dict[str, object]:
        """Files present before start and compiled since, logged as one line. `compile_s` is the
        caller's measured warm-up / capture time; without it no seconds are claimed: the line says
        that nothing was compiled, or only that files were compiled during startup."""
        ind, tri = count_files(self.inductor_dir), count_files(self.triton_dir)
        new_ind, new_tri = ind - self.inductor_files_at_start, tri - self.triton_files_at_start
        out: dict[str, object] = {
            "root": str(self.root),
            "warm_at_start": self.warm,
            "inductor_files_at_start": self.inductor_files_at_start,
            "triton_files_at_start": self.triton_files_at_start,
            "inductor_files_new": new_ind,
            "triton_files_new": new_tri,
            "compile_s": None if compile_s is None else round(compile_s, 3),
        }
        if compile_s is not None:
            done = f"{new_ind} + {new_tri} compiled now, {compile_s:.1f} s of warm-up / graph capture"
        elif new_ind + new_tri:
            done = f"{new_ind} + {new_tri} compiled during startup (compile time not measured)"
        else:
            done = "nothing compiled"
        log.info(
            "compile cache %s: %d inductor + %d triton files present at start, %s",
            self.root,
            self.inductor_files_at_start,
            self.triton_files_at_start,
            done,
        )
        return out


def setup_compile_cache(root: str | Path | None = None) -> CompileCache:
    """Point TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR at <root>/inductor and <root>/triton,
    with Inductor's FX / AOT caches and Triton's autotuning cache on (unless set otherwise).

    root: argument, else $NINFER_COMPILE_CACHE, else <repository>/compile_cache. Call before
    anything compiles (Triton JIT, fla autotuning, torch.compile); both libraries read the
    variables when they first need a cache directory. The caches are only valid for the same
    torch, Triton, CUDA and GPU; the libraries key their entries on those and recompile otherwise.
    """
    base = Path(root if root is not None else os.environ.get(ENV_ROOT) or DEFAULT_ROOT).resolve()
    inductor, triton = base / "inductor", base / "triton"
    for d in (inductor, triton):
        d.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor)
    os.environ["TRITON_CACHE_DIR"] = str(triton)
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    # autotuned kernels (fla's) keep their chosen config in the Triton cache: a warm start skips
    # their timing runs, and a restarted server runs the configs it ran before, so it computes the
    # same bits on the same input (timings that come out close can otherwise pick another config)
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    cache = CompileCache(base, inductor, triton, count_files(inductor), count_files(triton))
    log.info(
        "compile cache %s (%s): %d inductor, %d triton files present",
        base,
        "warm" if cache.warm else "cold",
        cache.inductor_files_at_start,
        cache.triton_files_at_start,
    )
    return cache
