"""Real gunicorn servers on 127.0.0.1 (ephemeral ports) over the demo artifact, one per test module.

`server` runs `python -m ninfer.service` with the real engine; `scripted_server` runs the same
service with the scripted engine of `fake_engine.py` for tests that need exact output tokens.
The demo artifact is built once per test session into a session cache dir (`NINFER_CACHE_DIR`).
`Traffic` checks what a real client sent: every HTTP response a 2xx (`/metrics`) and every
generation finished without error (the request log).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from ninfer.artifact import ensure_demo_artifact

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
API_KEY = "test-secret-key-123"
MODEL = "ninfer-demo"
# Routes whose 2xx answers are generations (one request_done each in the request log).
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")

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


def scrape(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    """Every sample of /metrics as `name{label=value,...}` -> value (labels sorted, model_name dropped)."""
    r = requests.get(f"{url}/metrics", headers=headers or {}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def http_responses(server: Server) -> Counter[tuple[str, str, str]]:
    """(route, method, status) -> responses so far, from `ninfer_http_requests_total` (/metrics
    scrapes themselves left out)."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for key, value in scrape(server.url, server.headers()).items():
        if key.startswith("ninfer_http_requests_total{"):
            labels = dict(kv.split("=", 1) for kv in key[key.index("{") + 1 : -1].split(","))
            if labels["route"] != "/metrics":
                counts[(labels["route"], labels["method"], labels["status"])] = int(value)
    return counts


@dataclass
class Traffic:
    """What a client sent from `Traffic(server)` on: the HTTP responses it got (/metrics) and the
    request log's events for its generations. `check` is the real-client contract: every response a
    2xx, every generation done (no request_rejected / request_error)."""

    server: Server
    http0: Counter[tuple[str, str, str]] = field(init=False)
    log0: int = field(init=False)

    def __post_init__(self) -> None:
        self.http0 = http_responses(self.server)
        self.log0 = len(self.server.events())

    def http(self) -> Counter[tuple[str, str, str]]:
        return http_responses(self.server) - self.http0

    def events(self) -> list[dict]:
        return [e for e in self.server.events()[self.log0 :] if e["event"].startswith("request_")]

    def check(self, output: str = "", timeout_s: float = 10.0) -> list[dict]:
        """Assert the contract and return the request_done events (a streamed generation is logged
        when its stream closes, which may be just after the client has read its end)."""
        http = self.http()
        bad = {k: n for k, n in http.items() if not k[2].startswith("2")}
        assert not bad, f"non-2xx responses: {bad}\n{output}"
        generations = sum(n for (route, _, _), n in http.items() if route in GENERATION_ROUTES)
        assert generations, f"no generation request reached the server: {dict(http)}\n{output}"
        deadline = time.monotonic() + timeout_s
        while True:
            events = self.events()
            failed = [e for e in events if e["event"] in ("request_rejected", "request_error")]
            assert not failed, f"requests failed: {failed}\n{output}"
            done = [e for e in events if e["event"] == "request_done"]
            if len(done) >= generations or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(done) == generations, f"{len(done)} request_done for {generations} generations\n{output}"
        return done


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


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, demo_cache: Path) -> Iterator[Server]:
    """The real engine over the demo artifact (max_concurrency 2, max_pending 2, context 512), one
    per test process: modules read its request log and metrics from their own start
    (`Tally.log0`, deltas), never from the server's."""
    srv = start_server(tmp_path_factory.mktemp("srv"), REAL_OVERRIDES, demo_cache)
    yield srv
    assert stop_server(srv) == 0, srv.stderr_path.read_text()[-3000:]


def start_scripted(tmp: Path, cache: Path, *extra: str) -> Server:
    """The scripted engine of `serve_fake.py` behind the real service; `extra` Hydra overrides."""
    overrides = [
        "engine.max_context=512",
        "engine.default_max_tokens=64",
        "logging.log_stats_interval_ms=100",
    ]
    return start_server(
        tmp, [*overrides, *extra], cache, command=[sys.executable, str(HERE / "serve_fake.py")]
    )


@pytest.fixture(scope="package")
def scripted_server(tmp_path_factory: pytest.TempPathFactory, demo_cache: Path) -> Iterator[Server]:
    """The scripted engine (fixed reply ids, the real stop handling) behind the same service, in
    the contract's strict mode; shared by the package's modules (test_scripted, test_responses)."""
    srv = start_scripted(tmp_path_factory.mktemp("scripted"), demo_cache)
    yield srv
    assert stop_server(srv) == 0, srv.stderr_path.read_text()[-3000:]


@pytest.fixture(scope="module")
def scripted_compat_server(tmp_path_factory: pytest.TempPathFactory, demo_cache: Path) -> Iterator[Server]:
    """The scripted engine with --client-compat (the agent SDK's strict tools need it)."""
    srv = start_scripted(tmp_path_factory.mktemp("scripted-compat"), demo_cache, "server.client_compat=true")
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
