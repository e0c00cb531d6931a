"""One real gunicorn server per test module on 127.0.0.1 with an ephemeral port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

HERE = Path(__file__).resolve().parent
API_KEY = "test-secret-key-123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    stderr_path: Path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]


def start_server(tmp: Path, overrides: list[str], timeout_s: float = 120.0) -> Server:
    port = free_port()
    log_path = tmp / "requests.jsonl"
    stderr_path = tmp / "server.stderr"
    args = [
        sys.executable,
        str(HERE / "serve_fake.py"),
        f"server.port={port}",
        f"server.api_key={API_KEY}",
        "server.cors=true",
        f"logging.request_log_jsonl={log_path}",
        *overrides,
    ]
    err = open(stderr_path, "wb")
    proc = subprocess.Popen(
        args, stdout=err, stderr=subprocess.STDOUT, cwd=HERE.parent.parent, env=os.environ.copy()
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}:\n{stderr_path.read_text()}")
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return Server(url, port, proc, log_path, stderr_path)
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server not ready in {timeout_s}s:\n{stderr_path.read_text()}")


def stop_server(server: Server) -> int:
    server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        return -9


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("srv"),
        [
            "engine.max_concurrency=2",
            "engine.max_pending_requests=2",
            "engine.max_context=512",
            "engine.default_max_tokens=64",
            "engine.pending_timeout_ms=400",
            "server.max_request_mib=1",
            "logging.log_stats_interval_ms=100",
        ],
    )
    yield srv
    stop_server(srv)
