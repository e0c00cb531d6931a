"""Real gunicorn servers on 127.0.0.1 (ephemeral ports) over the demo artifact, one per test module.

`server` runs `python -m ninfer.service` with the real engine; `scripted_server` runs the same
service with the scripted engine of `fake_engine.py` for tests that need exact output tokens.
The demo artifact is built once per test session into a session cache dir (`NINFER_CACHE_DIR`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from ninfer.artifact import ensure_demo_artifact

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
API_KEY = "test-secret-key-123"
MODEL = "ninfer-demo"

# The module server of test_http.py and of other modules that use the `server` fixture.
REAL_OVERRIDES = [
    "engine.device=cpu",
    "engine.max_concurrency=2",
    "engine.max_pending_requests=2",
    "engine.max_context=512",
    "kv.capacity=1024",
    "engine.default_max_tokens=16",
    "engine.pending_timeout_ms=2000",
    "server.max_request_mib=1",
    "server.drain_timeout_s=5",
    "logging.log_stats_interval_ms=100",
]


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


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session cache dir holding the demo artifact (built here once, found there by servers)."""
    cache = tmp_path_factory.mktemp("ninfer-cache")
    ensure_demo_artifact(cache)
    return cache


def wait_healthy(url: str, proc: subprocess.Popen[bytes], stderr_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}:\n{stderr_path.read_text()}")
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server not ready in {timeout_s}s:\n{stderr_path.read_text()}")


def launch(
    tmp: Path, argv: Callable[[int, Path], list[str]], cache: Path | None, timeout_s: float = 180.0
) -> Server:
    """Run `argv(port, request_log_path)` with `NINFER_CACHE_DIR=cache` and wait for /health."""
    port = free_port()
    log_path = tmp / "requests.jsonl"
    stderr_path = tmp / "server.stderr"
    env = os.environ.copy()
    if cache is not None:
        env["NINFER_CACHE_DIR"] = str(cache)
    err = open(stderr_path, "wb")
    proc = subprocess.Popen(argv(port, log_path), stdout=err, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, stderr_path, timeout_s)
    return Server(url, port, proc, log_path, stderr_path)


def start_server(
    tmp: Path, overrides: list[str], cache: Path | None = None, command: list[str] | None = None
) -> Server:
    """`command` (default `python -m ninfer.service`) with Hydra overrides, auth, CORS and the request log."""
    base = command or [sys.executable, "-m", "ninfer.service"]

    def argv(port: int, log_path: Path) -> list[str]:
        return [
            *base,
            f"server.port={port}",
            f"server.api_key={API_KEY}",
            "server.cors=true",
            f"logging.request_log_jsonl={log_path}",
            *overrides,
        ]

    return launch(tmp, argv, cache)


def stop_server(server: Server, timeout_s: float = 30.0) -> int:
    server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        return -9


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, demo_cache: Path) -> Iterator[Server]:
    """The real engine over the demo artifact (max_concurrency 2, max_pending 2, context 512)."""
    srv = start_server(tmp_path_factory.mktemp("srv"), REAL_OVERRIDES, demo_cache)
    yield srv
    assert stop_server(srv) == 0, srv.stderr_path.read_text()[-3000:]


@pytest.fixture(scope="module")
def scripted_server(tmp_path_factory: pytest.TempPathFactory, demo_cache: Path) -> Iterator[Server]:
    """The scripted engine (fixed reply ids, the real stop handling) behind the same service."""
    srv = start_server(
        tmp_path_factory.mktemp("scripted"),
        ["engine.max_context=512", "engine.default_max_tokens=64", "logging.log_stats_interval_ms=100"],
        demo_cache,
        command=[sys.executable, str(HERE / "serve_fake.py")],
    )
    yield srv
    assert stop_server(srv) == 0, srv.stderr_path.read_text()[-3000:]


@pytest.fixture(scope="package")
def compat_server(tmp_path_factory: pytest.TempPathFactory, demo_cache: Path) -> Iterator[Server]:
    """--client-compat over the terse test model (turns end after a few tokens), shared by the
    real-client test modules; auth on, seed fixed, context 16384."""
    from tests.service.terse_artifact import ensure_terse_artifact

    artifact = ensure_terse_artifact(demo_cache)
    srv = start_server(
        tmp_path_factory.mktemp("compat"),
        [
            f"model.artifact={artifact}",
            "engine.device=cpu",
            "engine.max_context=16384",
            "kv.capacity=16384",
            "server.client_compat=true",
            "sampling.seed=0",
            "logging.log_stats_interval_ms=500",
        ],
        demo_cache,
    )
    yield srv
    assert stop_server(srv) == 0, srv.stderr_path.read_text()[-3000:]
