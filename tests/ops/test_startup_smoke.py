"""The bench's cold/warm start rows run end to end on tiny CPU models (two fresh processes)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops.bench.startup import startup_rows


def test_cold_then_warm_start_rows() -> None:
    row = startup_rows("qwen3.6-35b-a3b", "cpu", "float32", "reference", False, True, timeout_s=300)
    for run in ("cold", "warm"):
        assert "error" not in row[run], row[run]
        assert row[run]["weights_s"] > 0 and row[run]["ready_s"] > 0
        assert row[run]["first_request_ttft_s"] <= row[run]["ready_s"]
    assert row["warm_ready_s"] == row["ready_s_warm"] == row["warm"]["ready_s"]
    assert row["ready_s_cold"] == row["cold"]["ready_s"]
    assert row["warm"]["cache"]["root"] == row["cold"]["cache"]["root"]  # one cache directory
