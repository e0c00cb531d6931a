"""The grammar-overhead benchmark end to end on the CPU (the engine the server builds, the demo
artifact): the result carries the decode rates both ways and each schema's compile times."""

from __future__ import annotations

import json
from pathlib import Path

from ninfer.artifact import ensure_demo_artifact
from ops.bench import grammar_overhead


def test_grammar_overhead_smoke(tmp_path: Path) -> None:
    art = str(ensure_demo_artifact())
    argv = [art, "--model", "demo", "--out", str(tmp_path), "--smoke", "--"]
    assert (
        grammar_overhead.main([*argv, "--device", "cpu", "--max-concurrency", "4", "--max-context", "256"])
        == 0
    )
    (path,) = tmp_path.glob("*-grammar-demo.json")
    doc = json.loads(path.read_text())
    for key in ("commit", "date", "gpu", "command", "model", "tokenizer_tables_s"):
        assert key in doc, key
    assert doc["decode_tok_s"]["plain"] > 0 and doc["decode_tok_s"]["constrained"] > 0
    rates = doc["decode_tok_s"]
    assert abs(doc["mask_overhead"] - (1 - rates["constrained"] / rates["plain"])) < 1e-3
    assert set(doc["compile_ms"]) == set(grammar_overhead.SCHEMAS)
    assert all(0 < t["cached"] <= t["first"] for t in doc["compile_ms"].values())
    assert doc["late_compiles"] == 0
