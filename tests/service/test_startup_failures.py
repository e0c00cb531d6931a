"""A server that cannot serve does not stay up: settings the artifact cannot honour exit 2 with
one line before the port is bound (vision without a tower; each speculative flag: --spec mtp
without an MTP head, --lm-head-draft without a proposal head, --spec dflash on a dense artifact or
on a MoE one without a drafter); a failure while the worker loads stops the whole server."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HERE, ROOT, free_port

from ninfer.artifact import ensure_demo_artifact
from ninfer.artifact.convert import convert
from ninfer.artifact.manifest import MANIFEST

sys.path.insert(0, str(ROOT / "tests" / "unit"))
from hf_fixtures import make_hf_checkpoint

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


SERVE = [sys.executable, "-m", "ninfer.service.cli", "--port", "{port}", "--device", "cpu"]


def _without_mtp(demo: Path, out: Path) -> Path:
    """The demo artifact less its MTP component: its files linked, its manifest and config
    rewritten (the artifact is opened without digest checks, as the server opens it)."""
    out.mkdir()
    for item in demo.iterdir():
        if item.name not in (MANIFEST, "config.json"):
            (out / item.name).symlink_to(item)
    manifest = json.loads((demo / MANIFEST).read_text())
    del manifest["components"]["mtp"]
    (out / MANIFEST).write_text(json.dumps(manifest))
    config = json.loads((demo / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 0
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def bare_artifacts(tmp_path_factory: pytest.TempPathFactory, demo_cache: Path) -> dict[str, Path]:
    """A dense artifact without an MTP head and a small MoE one without a DFlash drafter."""
    root = tmp_path_factory.mktemp("bare-artifacts")
    hf = make_hf_checkpoint(root / "hf", "moe", with_mtp=True, seed=1)
    moe = convert(hf, root / "moe.ninfer")
    shutil.rmtree(hf)
    return {"no_mtp": _without_mtp(ensure_demo_artifact(demo_cache), root / "no-mtp.ninfer"), "moe": moe}


@pytest.mark.parametrize(
    ("flags", "artifact", "key"),
    [
        (["--spec", "mtp"], "no_mtp", "spec.method=mtp: this artifact carries no MTP head"),
        (["--spec", "mtp", "--lm-head-draft"], None, "spec.lm_head_draft=true: this artifact has no"),
        (["--spec", "mtp", "--lm-head-draft"], "moe", "spec.lm_head_draft=true: this artifact has no"),
        (["--spec", "dflash"], "moe", "spec.method=dflash: this artifact carries no DFlash drafter"),
        (["--spec", "dflash", "--lm-head-draft"], None, "applies to spec.method=mtp only"),
    ],
    ids=[
        "mtp_without_head",
        "lm_head_draft_on_demo",
        "lm_head_draft_on_moe",
        "dflash_without_drafter",
        "lm_head_draft_with_dflash",
    ],
)
def test_speculative_flag_the_artifact_cannot_honour_exits_2(
    flags: list[str], artifact: str | None, key: str, bare_artifacts: dict[str, Path], demo_cache: Path
) -> None:
    """Each refused before the port is bound, in one line that names what to change."""
    where = [str(bare_artifacts[artifact])] if artifact is not None else []
    proc, port = _run([*SERVE, *where, *flags], demo_cache)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ninfer-serve: error: ") and key in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and _nothing_listens(port)


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
