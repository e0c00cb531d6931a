"""The cold tier in the request log: request_done fields and throughput occupancy valid under the
schema, and the request-done console suffix while the tier is active (the host arena an engine on
the CPU builds by default, against an engine with `cold_tier_host_mib=0`, which has no tier)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import jsonschema

from ninfer.service.recorder import Recorder
from ninfer.service.request_log import RequestLog
from ninfer.service.telemetry import Tracing
from ninfer.service.throughput import ThroughputReporter
from tests.engine.test_cold_tier import Chats, engine, run
from tests.speculative.helpers import mtp_model

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "request-log.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _events(path: Path) -> list[dict]:
    events = [json.loads(line) for line in path.read_text().splitlines()]
    for e in events:
        VALIDATOR.validate(e)
    return events


def test_request_done_fields_and_console_suffix(tmp_path: Path) -> None:
    model = mtp_model(0)
    tiered = engine(model)
    plain = engine(model, cold_tier_host_mib=0)
    assert tiered.cold_tier is not None and plain.cold_tier is None
    path = tmp_path / "log.jsonl"
    recorder = Recorder(RequestLog(str(path), "instance"), Tracing(None))
    job = SimpleNamespace(protocol="chat_completions", client_request_id=None, compat=[])
    handler = Lines()
    logging.getLogger("ninfer").addHandler(handler)
    logging.getLogger("ninfer").setLevel(logging.INFO)
    reporters = [ThroughputReporter(eng, recorder.log, 0) for eng in (tiered, plain)]
    try:
        chats = Chats(2)
        rid = 0
        for _ in range(2):
            for c in range(2):
                for eng in (tiered, plain):
                    out, st = run(eng, chats.prompt(c))
                    rid += 1
                    summary = {
                        "prepare_s": 0.001,
                        "finish_reason": "length",
                        "prompt_tokens": st.prompt_tokens,
                        "completion_tokens": st.completion_tokens,
                        "reasoning_tokens": None,
                        "tool_calls": 0,
                    }
                    recorder.done(rid, job, summary, st)
                chats.reply(c, out)
        for reporter in reporters:
            reporter.report()
    finally:
        logging.getLogger("ninfer").removeHandler(handler)
        tiered.shutdown(5)
        plain.shutdown(5)
    events = _events(path)
    done = [e for e in events if e["event"] == "request_done"]
    on, off = done[0::2], done[1::2]
    assert [e["cold_tier_restored"] for e in on] == [False, False, True, True]
    assert [e["prefix_reuse_path"] for e in on] == [
        "none",
        "full_reset",
        "append_frontier",
        "append_frontier",
    ]
    last = on[-1]
    assert (
        last["cold_tier_active"] and last["cold_tier_capacity_bytes"] == tiered.cold_tier.store.capacity_bytes
    )
    assert (last["cold_tier_parks"], last["cold_tier_restores"], last["cold_tier_entries"]) == (3, 2, 1)
    assert (
        last["cold_tier_evictions"]
        == last["cold_tier_park_failures"]
        == last["cold_tier_restore_failures"]
        == 0
    )
    assert sum(a["used_bytes"] for a in last["cold_tier_arenas"]) == last["cold_tier_used_bytes"] > 0
    assert [(a["device"], a["entries"]) for a in last["cold_tier_arenas"]] == [("cpu", 1)]
    for e in off:
        assert (
            not e["cold_tier_active"] and e["cold_tier_capacity_bytes"] == 0 and e["cold_tier_arenas"] == []
        )
    used = last["cold_tier_used_bytes"] / (1 << 30)
    done_lines = [ln for ln in handler.lines if " done: " in ln]
    assert done_lines[-2].endswith(
        f" cold=parks=3 restores=2 failures=0 entries=1 evictions=0 used={used:.2f}GiB"
    )
    assert all("cold=" not in ln for ln in done_lines[1::2])
    tp = [e for e in events if e["event"] == "throughput"]
    assert tp[0]["cold_tier"]["parks"] == 3 and "cold_tier" not in tp[1]
