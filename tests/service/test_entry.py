"""`python -m ninfer.service`: --help prints the settings keys; invalid configuration exits 2 with one
line; log path checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ninfer.service.request_log import RequestLog, RequestLogError, redact_argv


def test_invalid_config_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ninfer.service", "engine.max_concurrency=99"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "max_concurrency" in proc.stderr


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_settings_keys_and_exits_0(flag: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ninfer.service", flag], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m ninfer.service [KEY=VALUE ...]")
    assert "vision.media_live_mib" in proc.stdout and "vision.enabled=true" in proc.stdout
    assert "engine.max_context" in proc.stdout and proc.stderr == ""


def test_request_log_refuses_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(RequestLogError):
        RequestLog(str(tmp_path / "missing" / "x.jsonl"), "i")
    art = tmp_path / "model.ninfer"
    art.mkdir()
    with pytest.raises(RequestLogError):
        RequestLog(str(art / "manifest.json"), "i", str(art))
    log = RequestLog(str(tmp_path / "ok.jsonl"), "i", str(art))
    log.emit("throughput", x=0.1 + 0.2)
    log.close()
    assert '"x": 0.30000000000000004' in (tmp_path / "ok.jsonl").read_text()


def test_redact_argv() -> None:
    argv = ["--api-key", "s3cret", "server.api_key=s3cret", "--api-key=s3cret", "x"]
    assert "s3cret" not in " ".join(redact_argv(argv, "s3cret"))
