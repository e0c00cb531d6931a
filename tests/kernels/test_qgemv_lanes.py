"""`qgemv_lanes_kernel` (Gluon) built for sm_90 without a GPU holds to its design: no shared memory,
no barrier and no spill in its loop, and a bounded number of instructions a weight per format.

Gluon kernels do not run in the CPU interpreter; their results are checked on the GPU
(`test_qgemv.py::test_lanes_kernel` compiled, and `ops/bench/qgemv_micro.py` before timing)."""

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

# instructions a weight a thread in the loop (SASS, 4 rows a thread, 4 warps); measured 4.04 / 6.27 /
# 6.27 / 4.45 when written: a bound a little above, so a change that adds work to every lane fails
BOUNDS = {0: 4.5, 1: 6.6, 2: 6.6, 3: 4.9}


def test_lanes_kernel_sm90_loop(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # a cached build prints no ptxas log (registers, spills)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    args = [f"{fmt}:4:4" for fmt in BOUNDS]
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("lanes_compile.py")), *args],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["fmt"] for r in results] == list(BOUNDS)
    for r in results:
        loop = r["loop"]
        assert r["shared"] == 0 and r["spill_bytes"] == 0, r
        assert not any(op.startswith(("BAR", "STS", "LDS")) for op in loop), loop
        assert loop.get("FFMA", 0) > 0 and any(op.startswith("SHF.L.W") for op in loop), loop  # the rotate is emitted
        assert r["instructions_per_weight"] <= BOUNDS[r["fmt"]], r
