"""Builds the Gluon GEMV kernels for sm_90 (no GPU) and reports each variant's resources and loop.

Run without TRITON_INTERPRET: `python tests/kernels/gluon_compile.py lanes:FMT:R:WARPS mma:FMT:T:WARPS:GPI ...`
(`qgemv_lanes_kernel`: R rows a thread; `qgemv_mma_kernel`: T 16-row tiles a warp) prints one JSON
object per variant: shared memory, registers and spills (ptxas -v), and the SASS opcode counts of
the kernel's one loop (nvdisasm from the triton wheel), so a test can hold the kernel to its design
(no shared memory, no barriers, no spills) without a GPU.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget

SM90 = GPUTarget("cuda", 90, 32)
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
HIGH = {1: "*i8", 2: "*i16"}  # the high plane's pointer type (Q5 bytes, Q6 halfwords); else the base


def _loop_opcodes(sass: str) -> dict[str, int]:
    """Opcode counts between the loop's label and its backward branch (the longest such body)."""
    labels: dict[str, int] = {}
    instrs: list[str] = []
    for line in sass.splitlines():
        m = re.match(r"\s*\.(L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(instrs)
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            instrs.append(m.group(1).strip())
    best: list[str] = []
    for i, ins in enumerate(instrs):
        m = re.search(r"BRA\s+(?:`\(\.)?(L_x_\d+)", ins)
        if m and m.group(1) in labels and labels[m.group(1)] <= i and i + 1 - labels[m.group(1)] > len(best):
            best = instrs[labels[m.group(1)] : i + 1]
    counts = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0] for ins in best)
    return dict(counts)


def compile_variant(kernel: str, fmt: int, a: int, warps: int, gpi: int = 1) -> dict[str, Any]:
    from triton.experimental.gluon._runtime import GluonASTSource

    from ninfer.kernels.triton.qgemv_lanes import qgemv_lanes_kernel
    from ninfer.kernels.triton.qgemv_mma import qgemv_mma_kernel

    high = HIGH.get(fmt, "*i32")
    if kernel == "lanes":
        fn = qgemv_lanes_kernel
        const = {"FMT": fmt, "R": a, "Q": 32, "WARPS": warps, "EVEN_K": True, "PDL": True}
        ptrs = {"x_ptr": "*bf16", "base_ptr": "*i32", "high_ptr": high, "scale_ptr": "*fp16", "y_ptr": "*bf16"}
        weights_per_thread = a * 4 * (8 if fmt < 3 else 4)  # rows x one quad of words, every lane
    else:
        fn = qgemv_mma_kernel
        const = {"FMT": fmt, "T": a, "WARPS": warps, "GPI": gpi, "EVEN_K": True, "PDL": True}
        ptrs = {"x_ptr": "*i32", "base_ptr": "*i32", "high_ptr": high, "scale_ptr": "*fp16", "y_ptr": "*bf16"}
        weights_per_thread = a * 2 * 2 * 8 * gpi  # tiles x rows g, g + 8 x words 2q, 2q + 1 x lanes, groups
    names = list(fn.arg_names)
    sig = {n: "constexpr" if n in const else ptrs.get(n, "i32") for n in names}
    aligned = ("x_ptr", "base_ptr", "high_ptr", "scale_ptr", "y_ptr", "sx", "sb", "sh", "ss", "sy")
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in aligned}
    src = GluonASTSource(
        fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()}, attrs=attrs
    )
    knobs.nvidia.dump_ptxas_log = True
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        c = triton.compile(src, target=SM90, options={"num_warps": warps, "num_stages": 1})
    regs = re.search(r"Used (\d+) registers", log.getvalue())
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log.getvalue())
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(BIN / "nvdisasm"), "-c", f.name], capture_output=True, text=True, check=True)
    loop = _loop_opcodes(sass.stdout)
    return {
        "kernel": kernel,
        "fmt": fmt,
        "shared": int(c.metadata.shared),
        "registers": int(regs.group(1)) if regs else None,
        "spill_bytes": int(spills.group(1)) + int(spills.group(2)) if spills else None,
        "loop": loop,
        "instructions_per_weight": sum(loop.values()) / weights_per_thread,
    }


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        name, *nums = arg.split(":")
        print(json.dumps(compile_variant(name, *(int(v) for v in nums))), flush=True)
