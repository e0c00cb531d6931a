"""The GPU benchmark's --smoke mode: every section on tiny dense and MoE models on the CPU, valid JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("qwen3.6-27b", "qwen3.6-35b-a3b")


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _leaves(d: dict[str, Any]) -> list[Any]:
    return [v for x in d.values() for v in (_leaves(x) if isinstance(x, dict) else [x])]


def test_smoke_run_writes_every_section(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "ops/bench/run.py", "--smoke", "--out", str(tmp_path), "--budget-s", "120"],
        cwd=ROOT, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = list(tmp_path.glob("*-smoke.json"))
    assert len(files) == 1, sorted(p.name for p in tmp_path.iterdir())
    res = json.loads(files[0].read_text())
    for key in ("commit", "date", "torch", "command", "models"):
        assert res[key], key
    assert res["smoke"] is True and res["device"] == "cpu"
    assert _positive(res["copy_bandwidth_TBps"]) and _positive(res["matmul_bf16_TFLOPs"])
    assert set(res["models"]) == set(MODELS)
    for name in MODELS:
        m = res["models"][name]
        assert "error" not in m, (name, m.get("error"))
        assert m["skipped"] == [], (name, m["skipped"])
        assert m["backend"] == "reference" and m["fast_path"]["checked"] is False
        assert set(m["decode_tok_s"]) == {"1", "2"} and all(map(_positive, m["decode_tok_s"].values()))
        assert set(m["ttft_ms"]) == {"32", "64", "128"} and all(map(_positive, m["ttft_ms"].values()))
        for key in ("prefill_tok_s_8k", "prefill_mfu_8k", "roofline_decode_tok_s_bs1",
                    "hf_decode_tok_s_bs1", "eager_decode_tok_s_bs1"):  # fmt: skip
            assert _positive(m[key]), (name, key, m.get(key), m.get("hf_error"))
        assert all("error" not in p and p["kernels_per_step"] > 0 for p in m["profile"])
        assert set(m["kernels_per_step"]) == {"1", "2"} and all(map(_positive, m["kernels_per_step"].values()))
        assert m["compiled"] is False and m["sampling"]["top_k"] == 20
        assert set(m["sampling_tok_s"]) == {"1", "2"} and all(map(_positive, m["sampling_tok_s"].values()))
        assert all(map(_positive, m["sampling_over_greedy"].values()))
        spec = m["spec"]
        for table in ("oracle", "oracle_raw", "oracle_verify_only"):
            assert set(spec[table]) == {"1", "3"}
            for k in spec[table].values():
                assert set(k) == {"100", "40"} and all(set(b) == {"1", "2"} for b in k.values())
            assert all(map(_positive, _leaves(spec[table])))
        assert _positive(spec["draft_step_ms"]["full_head"]) and _positive(
            spec["draft_step_ms"]["proposal_head"]
        )
        assert _positive(spec["speedup_k3_acc100_bs1"])
        # 9 tokens at batch 1: the first from prefill, then two k=3 rounds of 3 drafts + 1 when every
        # draft is accepted (3.0 per round); at 40% acceptance more rounds with fewer drafts each
        acc = spec["mean_accepted_per_round"]["3"]
        assert acc["100"]["1"] == 3.0 and acc["40"]["1"] < 3.0
        assert spec["acceptance_rate"]["3"]["100"]["1"] == 1.0  # from the requests' own counters
