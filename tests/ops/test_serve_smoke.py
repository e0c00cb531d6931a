"""The serving benchmark end to end on the CPU: a real server over HTTP with streaming clients
(the conversations mode included), then the engine alone; the result JSON carries every figure
the GPU runs report."""

from __future__ import annotations

import json
from pathlib import Path

from ninfer.artifact import ensure_demo_artifact
from ops.bench import serve


def test_serve_bench_smoke(tmp_path: Path) -> None:
    art = str(ensure_demo_artifact())
    argv = [art, "--model", "demo", "--out", str(tmp_path), "--smoke", "--skip", "poisson,lengths"]
    assert serve.main([*argv, "--conversations", "3", "--turns", "2"]) == 0
    (path,) = tmp_path.glob("*-serve-demo.json")
    doc = json.loads(path.read_text())
    for key in ("commit", "date", "gpu", "command", "model", "first_after_ready_ttft_ms", "steady_ttft_ms"):
        assert key in doc, key
    assert set(doc["engine_tok_s"]) == {"1", "8"} and all(v > 0 for v in doc["engine_tok_s"].values())
    assert doc["engine_ttft_ms_c8"] > 0
    for key in ("c1", "c8"):
        h = doc["http"][key]
        assert h["errors"] == 0, h["first_error"]
        assert h["output_tok_s"] > 0 and h["of_engine"] > 0
        assert set(h["ttft_ms"]) == set(h["itl_ms"]) == {"p50", "p90", "p99"}
    assert doc["first_after_ready"]["errors"] == 0
    assert doc["late_compiles"] == 0  # nothing compiles on the CPU: the count is read and zero
    mt = doc["multi_turn"]
    assert mt["errors"] == 0 and mt["later_turns"] == 2 and mt["later_turns_cached"] == 2
    conv = doc["conversations"]  # 3 conversations on 8 lanes: every later turn finds its lane
    assert conv["errors"] == 0, conv["first_error"]
    assert conv["requests"] == 6 and conv["later_turns"] == 3 and conv["later_turns_cached"] == 3
    assert conv["output_tok_s"] > 0 and conv["history_tokens_reached"]["max"] > 0
    assert conv["cold_tier"] is True and conv["cold_tier_kind"] == "host"  # no second GPU: host memory
    # the conversations' first turns take lanes earlier sections left resident (parking those);
    # each later turn finds its own lane still resident, none comes back from the tier
    assert conv["cold_tier_settings"]["enabled"] is True and conv["restored"] == 0
    assert set(conv["later_ttft_by_prefix"]) == {"resident"}
    assert conv["later_ttft_by_prefix"]["resident"]["ttft_ms"]["p50"] > 0
    assert doc["soak"]["errors"] == 0 and doc["soak"]["requests"] >= 1
    assert doc["synthetic_weights"] is False
    assert (tmp_path / "serve-requests.jsonl").is_file()
