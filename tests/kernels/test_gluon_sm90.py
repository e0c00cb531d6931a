"""The Gluon GEMV kernels (`qgemv_lanes`, `qgemv_mma`) built for sm_90 without a GPU hold to their
design: no shared memory, no barrier and no spill in the loop, the mma on the tensor cores, and a
bounded number of instructions a weight per format.

Gluon kernels do not run in the CPU interpreter; their results are checked on the GPU
(`test_qgemv.py::test_lanes_kernel` / `test_mma_kernel` compiled, and `ops/bench/qgemv_micro.py`
before timing)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sm90_compile import ptxas_path

pytestmark = pytest.mark.skipif(ptxas_path() is None, reason="the triton wheel ships no ptxas")

# instructions a weight a thread in the loop (SASS): measured when written, the bound a little above,
# so a change that adds work to every lane fails. lanes: 4 rows a thread, 4 warps (4.04 / 6.27 / 6.27 /
# 4.45 for Q4 / Q5 / Q6 / W8); mma: 2 tiles a warp, 4 warps, 2 groups a loop (2.37 / 4.60 / 4.59)
# (Q6 decodes as Q5 does, with two high bits: not built here, to keep the suite short)
BOUNDS = {"lanes:0:4:4": 4.5, "lanes:1:4:4": 6.6, "lanes:3:4:4": 4.9, "mma:0:2:4:2": 2.6, "mma:1:2:4:2": 4.9}


def test_gluon_kernels_sm90_loop(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # a cached build prints no ptxas log (registers, spills)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    args = list(BOUNDS)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("gluon_compile.py")), *args],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(BOUNDS)
    for arg, r in zip(BOUNDS, results, strict=True):
        loop = r["loop"]
        assert r["shared"] == 0 and r["spill_bytes"] == 0, r
        assert not any(op.startswith(("BAR", "STS", "LDS")) for op in loop), loop
        if r["kernel"] == "lanes":  # the rotate is one funnel shift, the products CUDA-core FMAs
            assert loop.get("FFMA", 0) > 0 and any(op.startswith("SHF.L.W") for op in loop), loop
        else:  # the products on the tensor cores, the offsets removed by packed bf16 FMAs
            assert loop.get("HMMA.16816.F32.BF16", 0) > 0 and loop.get("HFMA2.BF16_V2", 0) > 0, loop
        assert r["instructions_per_weight"] <= BOUNDS[arg], r
