"""`ninfer-serve --port N` without an artifact serves the demo; SIGTERM drains within the bound."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import requests
from conftest import MODEL, Server, launch

from ninfer.artifact.demo import demo_path

DRAIN_S = 2.0
SLACK_S = 10.0  # gunicorn's signal hand-off, one engine step, the loaded test machine


def start(tmp: Path, cache: Path) -> Server:
    serve = Path(sys.executable).parent / "ninfer-serve"

    def argv(port: int, log: Path) -> list[str]:
        return [
            str(serve),
            "--port",
            str(port),
            "--device",
            "cpu",
            "--max-context",
            "1024",
            "--request-log-jsonl",
            str(log),
            "--log-stats-interval-ms",
            "200",
            "--set",
            f"server.drain_timeout_s={DRAIN_S}",
        ]

    return launch(tmp, argv, cache)


def test_ninfer_serve_demo_and_sigterm_drain(tmp_path: Path, demo_cache: Path) -> None:
    srv = start(tmp_path, demo_cache)
    try:
        chat = f"{srv.url}/v1/chat/completions"
        r = requests.post(
            chat, json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}]}
        with requests.post(
            chat, json={**body, "max_tokens": 1000, "stream": True}, stream=True, timeout=60
        ) as s:
            assert s.status_code == 200
            rid = int(s.headers["x-request-id"])
            lines = s.iter_lines()
            for _ in range(3):
                next(lines)
            t0 = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
            elapsed = time.monotonic() - t0
        assert elapsed < DRAIN_S + SLACK_S
        assert rest[-1] == b"data: [DONE]"
        last = json.loads(rest[-2].removeprefix(b"data: "))
        if "error" in last:  # cancelled at the drain deadline: an in-band error, then [DONE]
            assert last["error"]["code"] == "request_cancelled"
        else:
            assert last["choices"][0]["finish_reason"] in ("length", "stop")
        assert srv.proc.wait(timeout=DRAIN_S + SLACK_S + 10) == 0
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    events = srv.events()
    start_event = events[0]
    assert start_event["event"] == "server_start"
    assert start_event["artifact"]["path"] == str(demo_path(demo_cache))
    assert start_event["argv"][1:3] == ["--port", str(srv.port)]
    ended = [
        e for e in events if e.get("request_id") == rid and e["event"] in ("request_done", "request_error")
    ]
    assert len(ended) == 1
    if ended[0]["event"] == "request_error":
        assert ended[0]["http"]["code"] == "request_cancelled"
    final = [e for e in events if e["event"] == "throughput"][-1]["scheduler"]
    assert final["running"] == final["waiting"] == final["live_tickets"] == 0
    assert final["free_pages"] + final["resident_pages"] == final["total_pages"]
