"""Slow, idle and lying clients cannot hold the server: requests reach a thread only once read whole.

A scripted-engine server over the demo artifact (its answers cost no model compute, so the
latencies measured are the connection handling's) with short read deadlines.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from conftest import API_KEY, HERE, MODEL, ROOT, Server, start_server, stop_server

# read deadlines long enough that 256 connections and four answers fit well inside the first of
# them on a loaded 2-core machine (with 5 s / 3 s the attackers with a started body were dropped
# before the answers' check whenever the machine was busy)
HEADER_S, BODY_S, KEEPALIVE_S = 10.0, 8.0, 5
SLACK_S = 2.5  # deadline sweep, the loaded test machine
ATTACKERS = 256
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory, demo_cache: Path) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("slow"),
        [
            "engine.max_context=512",
            "engine.default_max_tokens=64",
            f"server.header_timeout_s={HEADER_S}",
            f"server.body_timeout_s={BODY_S}",
            f"server.keepalive_s={KEEPALIVE_S}",
            "server.max_request_mib=1",
            "logging.log_stats_interval_ms=200",
        ],
        demo_cache,
        command=[sys.executable, str(HERE / "serve_fake.py")],
    )
    yield srv
    assert stop_server(srv) == 0, srv.stderr_path.read_text()[-3000:]


def _attackers(port: int, n: int) -> list[socket.socket]:
    """A third idle, a third sending a started head, a third a body shorter than its length."""
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 3 == 1:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        elif i % 3 == 2:
            s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        socks.append(s)
    return socks


def _drip(socks: list[socket.socket], stop: threading.Event) -> None:
    """One more header line (or body byte) every 0.3 s on every slow connection."""
    k = 0
    while not stop.wait(0.3):
        for i, s in enumerate(socks):
            try:
                if i % 3 == 1:
                    s.sendall(f"x-drip-{k}: 1\r\n".encode())
                elif i % 3 == 2:
                    s.sendall(b" ")
            except OSError:
                pass
        k += 1


def test_256_slow_and_idle_connections_leave_health_and_chat_answering(slow_server: Server) -> None:
    """Answers while every attacker is still connected: a server they held would answer only once
    their deadlines dropped them (no per-answer wall-clock bound: that measures the load)."""
    t_attack = time.monotonic()
    socks = _attackers(slow_server.port, ATTACKERS)
    stop = threading.Event()
    dripper = threading.Thread(target=_drip, args=(socks, stop), daemon=True)
    dripper.start()
    try:
        time.sleep(0.5)
        for _ in range(2):
            r = requests.get(f"{slow_server.url}/health", timeout=BODY_S)
            assert r.status_code == 200, r.text
            r = requests.post(
                f"{slow_server.url}/v1/chat/completions",
                json=CHAT,
                headers=slow_server.headers(),
                timeout=BODY_S,
            )
            assert r.status_code == 200, r.text
        answered_s = time.monotonic() - t_attack
        assert answered_s < BODY_S, answered_s  # before any attacker's deadline could free the server
        # the attackers were all still connected while those were answered
        alive = 0
        for s in socks:
            s.setblocking(False)
            try:
                alive += s.recv(1) != b""
            except BlockingIOError:
                alive += 1
            except OSError:
                pass
        assert alive == ATTACKERS
    finally:
        stop.set()
        dripper.join(5)
        for s in socks:
            s.close()


def _answer(sock: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    sock.settimeout(timeout_s)
    t0 = time.monotonic()
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError:
        pass
    return data, time.monotonic() - t0


def _status(data: bytes) -> int | None:
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None


def test_lying_slow_and_idle_clients_get_408_or_close(slow_server: Server) -> None:
    cases = {
        "short_body": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
        "open_chunked": b'POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"a":',
        "slow_head": b"GET /health HTTP/1.1\r\nHost: x\r\n",
        "idle": b"",
    }
    socks = {}
    for name, data in cases.items():
        socks[name] = socket.create_connection(("127.0.0.1", slow_server.port))
        if data:
            socks[name].sendall(data)
    results: dict[str, tuple[bytes, float]] = {}
    threads = [
        threading.Thread(target=lambda n=n, s=s: results.__setitem__(n, _answer(s, 30.0)))
        for n, s in socks.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    for s in socks.values():
        s.close()
    for name in ("short_body", "open_chunked"):
        data, took = results[name]
        assert _status(data) == 408 and took < BODY_S + SLACK_S, (name, data, took)
    data, took = results["slow_head"]
    assert _status(data) == 408 and took < HEADER_S + SLACK_S, (data, took)
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    data, took = results["idle"]
    assert data == b"" and KEEPALIVE_S - 0.5 < took < KEEPALIVE_S + SLACK_S, took
    assert requests.get(f"{slow_server.url}/health", timeout=5).status_code == 200


def test_pipelined_and_keep_alive_requests_still_work(slow_server: Server) -> None:
    sock = socket.create_connection(("127.0.0.1", slow_server.port), timeout=10)
    one = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    sock.sendall(one + one[:10])  # the second request arrives in two pieces
    time.sleep(0.2)
    sock.sendall(one[10:])
    data = b""
    while data.count(b"HTTP/1.1 200") < 2:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    sock.close()


def test_short_soak_leaves_the_server_idle(slow_server: Server) -> None:
    """ops/soak/soak.py for 15 s: every attack runs, the good client is served, the server settles."""
    argv = [
        sys.executable,
        str(ROOT / "ops" / "soak" / "soak.py"),
        f"--url={slow_server.url}",
        f"--api-key={API_KEY}",
        "--duration-s=15",
        f"--pid={slow_server.proc.pid}",
        f"--request-log={slow_server.log_path}",
        "--min-success=0.8",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["failures"] == [], proc.stdout[-3000:]
    assert report["settle"]["scheduler"]["live_tickets"] == 0
    assert {"slow_headers", "slow_body", "idle", "disconnects", "bursts", "bad_inputs"} <= set(
        report["attacks"]
    )
    assert all(report["rss_kib"]["after"].values())
