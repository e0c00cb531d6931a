"""The GEMV micro-benchmark's --smoke mode: tiny dense and MoE projections on the CPU interpreter, valid JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_writes_every_projection(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "ops/bench/gemv_micro.py", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "gemv_micro.json").read_text())
    assert res["smoke"] is True and res["device"] == "cpu"
    assert set(res["models"]) == {"qwen3.6-27b", "qwen3.6-35b-a3b"}
    for name, m in res["models"].items():
        names = {r["name"] for r in m["rows"]}
        assert {"gdn.in_proj_qkvzba", "gdn.out_proj", "attn.qkv", "attn.o_proj", "lm_head"} <= names
        if name.endswith("a3b"):
            assert {"moe.router|shared_gate", "shared.gate_up", "shared.down_proj"} <= names
            merged_gate = next(r for r in m["rows"] if r["name"] == "moe.router|shared_gate")
            assert merged_gate["n"] == 8 + 1  # the smoke model's 8 experts + the shared-expert gate
        else:
            assert {"mlp.gate_up", "mlp.down_proj"} <= names
        for r in m["rows"]:
            assert r["m"] in (1, 2)
            assert r["max_rel_err"] < 1e-2, r  # bf16 output rounding
            for key in ("ours_us", "torch_us", "speedup", "ours_GBps"):
                assert math.isfinite(r[key]) and r[key] > 0, (key, r)
        for variant in ("separate", "merged"):
            totals = m["step_totals_us"][variant]
            assert set(totals) == {"1", "2"}
            assert all(t["ours_us"] > 0 and t["torch_us"] > 0 for t in totals.values())
    assert "step total, merged" in proc.stdout
