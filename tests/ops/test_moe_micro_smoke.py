"""The MoE micro-benchmark's --smoke mode: tiny shapes on the CPU interpreter, valid JSON and table."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_writes_json(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "ops/bench/moe_micro.py", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "moe_micro.json").read_text())
    assert res["smoke"] is True and res["device"] == "cpu"
    assert res["shape"]["layers"] == 2 and res["shape"]["copies"] == 2
    by_n = res["results"]["small"]
    assert set(by_n) == {"1", "2"}
    for r in by_n.values():
        assert "error" not in r, r
        for key in ("us_per_layer", "GBps_distinct", "frac_of_bw", "distinct_experts_mean"):
            assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, (key, r)
        assert r["rel_err_vs_ref"] < 2e-2  # bf16: fp32 vs bf16 summation of the experts
    assert "small" in proc.stdout and "us/layer" in proc.stdout
