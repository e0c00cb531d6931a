"""A server that cannot serve does not stay up: settings the artifact cannot honour exit 2 with
one line before the port is bound; a failure while the worker loads stops the whole server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HERE, ROOT, free_port

EXIT_TIMEOUT_S = 90.0


def _run(argv: list[str], cache: Path) -> tuple[subprocess.CompletedProcess[str], int]:
    port = free_port()
    env = {**os.environ, "NINFER_CACHE_DIR": str(cache)}
    argv = [a.replace("{port}", str(port)) for a in argv]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=EXIT_TIMEOUT_S)
    return proc, port


def _nothing_listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (
            [sys.executable, "-m", "ninfer.service.cli", "--vision", "--port", "{port}", "--device", "cpu"],
            "vision",
        ),
        ([sys.executable, "-m", "ninfer.service", "spec.method=dflash", "server.port={port}"], "spec.method"),
    ],
    ids=["vision_without_tower", "dflash_on_dense"],
)
def test_setting_the_artifact_cannot_honour_exits_2(argv: list[str], key: str, demo_cache: Path) -> None:
    proc, port = _run(argv, demo_cache)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and ": error: " in lines[0], proc.stderr[-2000:]
    assert _nothing_listens(port)


def test_engine_failure_during_warm_up_stops_the_server(demo_cache: Path) -> None:
    argv = [sys.executable, str(HERE / "serve_failing.py"), "server.port={port}", "engine.device=cpu"]
    proc, port = _run(argv, demo_cache)
    assert proc.returncode != 0
    assert "engine warm-up failed (test)" in proc.stderr
    assert _nothing_listens(port)
