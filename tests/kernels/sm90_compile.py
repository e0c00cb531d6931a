"""Records the launches of ninfer's Triton kernels and compiles every distinct variant for sm_90 (no GPU).

`Recorder` wraps every `@triton.jit` kernel of `ninfer.kernels.triton`; each launch is specialised
exactly as Triton's launcher would on an H200 (Triton's own binder for the CUDA backend: pointer
dtypes and 16-byte alignment, ints by magnitude / value 1 / divisibility by 16, constexprs,
num_warps / num_stages). Launches whose tensors are CPU tensors run in the interpreter as usual;
launches with `meta` tensors (the real model widths) are only recorded. `compile_variants` builds
each variant with the pip wheel's ptxas for GPUTarget("cuda", 90, 32) in subprocesses without
TRITON_INTERPRET and reports shared memory, warps, registers and spills (from ptxas -v).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

SM90 = GPUTarget("cuda", 90, 32)
MAX_SHARED = 232448  # bytes of shared memory one block may use on sm_90 (opt-in maximum)
MAX_REGS_PER_BLOCK = 65536
PACKAGE = "ninfer.kernels.triton"


def ptxas_path() -> Path | None:
    """The ptxas shipped in the triton wheel, or None when it is missing."""
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return path if path.is_file() and os.access(path, os.X_OK) else None


@dataclass(frozen=True)
class Variant:
    """One compiled form of a kernel: what Triton's cache key holds, in JSON-able tuples."""

    module: str  # importable module name, or a file path for kernels outside the package
    kernel: str
    signature: tuple[tuple[str, str], ...]  # (parameter, "*bf16" / "i32" / "fp32" / "constexpr" ...)
    constexprs: tuple[tuple[tuple[int, ...], Any], ...]  # (argument path, value; dtypes as ("dtype", name))
    attrs: tuple[tuple[tuple[int, ...], tuple[tuple[str, int], ...]], ...]
    num_warps: int
    num_stages: int

    def label(self) -> str:
        consts = {self.signature[p[0]][0]: v[1] if isinstance(v, tuple) else v for p, v in self.constexprs}
        return f"{self.module.rsplit('.', 1)[-1]}.{self.kernel}{consts} warps={self.num_warps} stages={self.num_stages}"


@dataclass
class CompileResult:
    """The sm_90 build of one variant (`error` empty when it compiled)."""

    variant: Variant
    error: str = ""
    shared: int = 0
    num_warps: int = 0
    registers: int | None = None
    spill_bytes: int | None = None  # spill stores + spill loads reported by ptxas -v

    def problems(self) -> list[str]:
        """Why this variant cannot launch on an H200 (empty when it can)."""
        if self.error:
            return [f"does not compile: {self.error}"]
        out = []
        if self.shared > MAX_SHARED:
            out.append(f"shared memory {self.shared} B > {MAX_SHARED} B")
        if self.spill_bytes:
            out.append(f"register spills: {self.spill_bytes} B")
        if self.registers is not None and self.registers * 32 * self.num_warps > MAX_REGS_PER_BLOCK:
            out.append(f"{self.registers} registers x {32 * self.num_warps} threads > {MAX_REGS_PER_BLOCK}")
        return out


def package_kernels() -> dict[str, Any]:
    """module.name -> kernel object for every `@triton.jit` function defined in the package (Gluon
    kernels have no interpreter to record through: `test_gluon_sm90.py` builds those)."""
    from triton.experimental.gluon._runtime import GluonJITFunction

    pkg = importlib.import_module(PACKAGE)
    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{PACKAGE}.{info.name}")
        for name, obj in vars(mod).items():
            fn = getattr(obj, "fn", None)
            if isinstance(obj, GluonJITFunction):
                continue
            if hasattr(obj, "run") and getattr(fn, "__module__", None) == mod.__name__:
                found[f"{mod.__name__}.{name}"] = obj
    return found


def _encode(value: Any) -> Any:
    if isinstance(value, tl.dtype):
        return ("dtype", str(value))
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise TypeError(f"constexpr value {value!r} cannot be recorded")


def _decode(value: Any) -> Any:
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == "dtype":
        return tl.dtype(value[1])
    return value


class Recorder:
    """Context manager: while active, every launch of the given kernels is recorded (see module doc).

    `variants` keeps first-seen order; `where[v]` lists the scenario labels (`scenario(...)`).
    """

    def __init__(self, kernels: dict[str, Any] | None = None) -> None:
        self.kernels = package_kernels() if kernels is None else kernels
        self.backend = make_backend(SM90)
        self.variants: dict[Variant, list[str]] = {}
        self.launched: set[str] = set()
        self._label = "unlabelled"
        self._binders: dict[str, tuple[JITFunction, Any]] = {}

    @contextlib.contextmanager
    def scenario(self, label: str) -> Iterator[None]:
        previous, self._label = self._label, label
        try:
            yield
        finally:
            self._label = previous

    def __enter__(self) -> Recorder:
        for key, kernel in self.kernels.items():
            kernel.run = self._wrap(key, kernel)  # instance attribute shadows the class's run
        return self

    def __exit__(self, *exc: object) -> None:
        for kernel in self.kernels.values():
            kernel.__dict__.pop("run", None)

    def _wrap(self, key: str, kernel: Any):
        original = kernel.run

        def run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            self.record(key, kernel, args, kwargs)
            if any(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in args):
                return None  # real-width signature only: nothing to execute
            return original(*args, grid=grid, warmup=warmup, **kwargs)

        return run

    def record(self, key: str, kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Variant:
        if key not in self._binders:
            jit = JITFunction(kernel.fn)
            self._binders[key] = (
                jit,
                create_function_from_signature(jit.signature, jit.params, self.backend),
            )
        jit, binder = self._binders[key]
        bound, spec, options = binder(*args, **kwargs)
        opts, signature, constexprs, attrs = jit._pack_args(self.backend, kwargs, bound, spec, options)
        module, _, name = key.rpartition(".")
        variant = Variant(
            module=module,
            kernel=name,
            signature=tuple(signature.items()),
            constexprs=tuple((tuple(p), _encode(v)) for p, v in constexprs.items()),
            attrs=tuple((tuple(p), tuple(tuple(a) for a in v)) for p, v in attrs.items()),
            num_warps=opts.num_warps,
            num_stages=opts.num_stages,
        )
        self.variants.setdefault(variant, [])
        if self._label not in self.variants[variant]:
            self.variants[variant].append(self._label)
        self.launched.add(key)
        return variant


# ---- compilation (in subprocesses: the kernels must be real JITFunctions, not interpreted ones) ----


def compile_variants(variants: list[Variant], jobs: int = 2, timeout: float = 600.0) -> list[CompileResult]:
    """Compile each variant for sm_90 in `jobs` subprocesses; results in the order given."""
    if not variants:
        return []
    chunks = [variants[i::jobs] for i in range(jobs) if variants[i::jobs]]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory(prefix="sm90_") as tmp:
        procs = []
        for i, chunk in enumerate(chunks):
            src, dst = Path(tmp, f"in{i}.json"), Path(tmp, f"out{i}.json")
            src.write_text(json.dumps([asdict(v) for v in chunk]))
            # a fresh Triton cache: every variant runs ptxas, so its -v report (registers, spills) is seen
            penv = dict(env, TRITON_CACHE_DIR=str(Path(tmp, f"cache{i}")))
            cmd = [sys.executable, __file__, str(src), str(dst)]
            procs.append(
                (subprocess.Popen(cmd, env=penv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT), dst)
            )
        by_variant: dict[Variant, CompileResult] = {}
        for (proc, dst), chunk in zip(procs, chunks, strict=True):
            out, _ = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"sm_90 compile worker failed ({proc.returncode}):\n{out.decode()[-4000:]}"
                )
            for v, r in zip(chunk, json.loads(dst.read_text()), strict=True):
                by_variant[v] = CompileResult(variant=v, **r)
    return [by_variant[v] for v in variants]


def _variant_from_json(d: dict[str, Any]) -> Variant:
    return Variant(
        module=d["module"],
        kernel=d["kernel"],
        signature=tuple((k, t) for k, t in d["signature"]),
        constexprs=tuple((tuple(p), _decode(v)) for p, v in d["constexprs"]),
        attrs=tuple((tuple(p), tuple((a, b) for a, b in v)) for p, v in d["attrs"]),
        num_warps=d["num_warps"],
        num_stages=d["num_stages"],
    )


def _load_kernel(v: Variant) -> Any:
    if v.module.endswith(".py"):  # a kernel file outside the package (the recorder's own tests)
        spec = importlib.util.spec_from_file_location(Path(v.module).stem, v.module)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(v.module)
    kernel = getattr(mod, v.kernel)
    if not isinstance(kernel, JITFunction):
        raise TypeError(
            f"{v.module}.{v.kernel} is {type(kernel).__name__}, not a JITFunction (TRITON_INTERPRET set?)"
        )
    return kernel


def compile_one(v: Variant) -> dict[str, Any]:
    """Build one variant (called in the worker); ptxas -v output is captured for registers and spills."""
    from triton import knobs
    from triton.compiler import ASTSource

    knobs.nvidia.dump_ptxas_log = True  # the log is printed to stdout after a successful ptxas run
    src = ASTSource(
        fn=_load_kernel(v),
        signature=dict(v.signature),
        constexprs={p: val for p, val in v.constexprs},
        attrs={p: [list(a) for a in val] for p, val in v.attrs},
    )
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            c = triton.compile(
                src, target=SM90, options={"num_warps": v.num_warps, "num_stages": v.num_stages}
            )
    except Exception as err:  # the compiler's own message is the finding
        return {"error": f"{type(err).__name__}: {str(err)[:3000]}"}
    text = log.getvalue()
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {
        "shared": int(c.metadata.shared),
        "num_warps": int(c.metadata.num_warps),
        "registers": int(regs.group(1)) if regs else None,
        "spill_bytes": int(spills.group(1)) + int(spills.group(2)) if spills else None,
    }


def _worker(src: str, dst: str) -> None:
    variants = [_variant_from_json(d) for d in json.loads(Path(src).read_text())]
    Path(dst).write_text(json.dumps([compile_one(v) for v in variants]))


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("the sm_90 compile worker must run without TRITON_INTERPRET")
    _worker(sys.argv[1], sys.argv[2])
