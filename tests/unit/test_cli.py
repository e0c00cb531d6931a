"""ninfer-serve: flag -> override translation, --help, one-line errors with exit 2, argv redaction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ninfer.config import argv_redacted, load_settings
from ninfer.config.options import CONTRACT_OPTIONS
from ninfer.service import cli

ENV = {k: v for k, v in os.environ.items() if not k.upper().startswith("NINFER_")}


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ninfer.service.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env or ENV,
        timeout=60,
    )


def test_translate_is_one_override_per_flag() -> None:
    argv = ["models/q.ninfer", "--max-context", "16384", "--kv-capacity", "32768", "--max-concurrency", "2"]
    argv += ["--spec", "mtp", "--draft-tokens", "3", "--lm-head-draft", "--no-cold-tier", "--device", "cpu"]
    overrides = cli.translate(argv)
    assert overrides[0] == "model.artifact='models/q.ninfer'"  # independent keys: any order after it
    assert sorted(overrides[1:]) == sorted(
        [
            "engine.max_context='16384'",
            "kv.capacity='32768'",
            "engine.max_concurrency='2'",
            "engine.device='cpu'",
            "spec.method='mtp'",
            "spec.draft_tokens='3'",
            "spec.lm_head_draft=true",
            "cold_tier.enabled=false",
        ]
    )
    assert cli.translate([]) == []
    assert cli.translate(["--preset", "qwen27b", "--set", "telemetry.exporter=console"]) == [
        "+preset='qwen27b'",
        "telemetry.exporter=console",
    ]


def test_every_flag_translates_to_its_key() -> None:
    for option in CONTRACT_OPTIONS:
        argv = [option.flag] if option.is_switch else [option.flag, "7"]
        (override,) = cli.translate(argv)
        expected_value = ("true" if option.switch_value else "false") if option.is_switch else "'7'"
        assert override == f"{option.key}={expected_value}", option.flag


def test_contract_example_resolves(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["models/qwen3_6_27b.ninfer", "--host", "127.0.0.1", "--port", "8080", "--max-context", "16384"]
    argv += ["--kv-capacity", "32768", "--max-concurrency", "2", "--spec", "mtp", "--draft-tokens", "3"]
    argv += ["--lm-head-draft", "--check-config"]
    assert cli.main(argv) == 0
    dump = json.loads(capsys.readouterr().out)
    assert dump["model"]["artifact"] == "models/qwen3_6_27b.ninfer"
    assert (dump["engine"]["max_context"], dump["kv"]["capacity"], dump["engine"]["max_concurrency"]) == (
        16384,
        32768,
        2,
    )
    assert dump["spec"] == {"method": "mtp", "draft_tokens": 3, "lm_head_draft": True}


def test_flags_equal_hydra_overrides() -> None:
    argv = [
        "a.ninfer",
        "--vision",
        "--media-live-mib",
        "512",
        "--temperature",
        "0.6",
        "--seed",
        "7",
        "--cors",
    ]
    by_flags = load_settings(cli.translate(argv))
    keys = ["model.artifact=a.ninfer", "vision.enabled=true", "vision.media_live_mib=512"]
    keys += ["sampling.temperature=0.6", "sampling.seed=7", "server.cors=true"]
    by_keys = load_settings(keys)
    assert by_flags == by_keys


def test_set_wins_over_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--port", "9000", "--set", "server.port=9001", "--check-config"]) == 0
    assert json.loads(capsys.readouterr().out)["server"]["port"] == 9001


def test_help_prints_the_option_contract() -> None:
    text = cli.build_parser().format_help()
    flat = " ".join(text.split())
    for option in CONTRACT_OPTIONS:
        head = f"{option.flag} {option.metavar}" if option.metavar else option.flag
        assert head in flat, option.flag
        assert " ".join(f"{option.meaning} [default: {option.default}]".split()) in flat, option.flag


def test_cross_field_errors_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        (
            "--draft-tokens",
            "3",
        ): "--draft-tokens=3 (spec.draft_tokens): requires spec.method (--spec mtp|dflash)",
        (
            "--lm-head-draft",
        ): "--lm-head-draft (spec.lm_head_draft=true): requires spec.method (--spec mtp|dflash)",
        ("--spec", "mtp", "--draft-tokens", "6"): (
            "--draft-tokens=6 (spec.draft_tokens): must be an integer in 1..5 with spec.method=mtp"
        ),
        ("--spec", "dflash", "--lm-head-draft"): (
            "--lm-head-draft (spec.lm_head_draft=true): applies to spec.method=mtp only (drop it with --spec dflash)"
        ),
        ("--spec", "dflash", "--vision"): (
            "--vision (vision.enabled=true): cannot be combined with spec.method=dflash (DFlash is text-only)"
        ),
        ("--max-context", "16384", "--kv-capacity", "8192"): (
            "--kv-capacity=8192 (kv.capacity): must be an integer in 16384..16384 (at least one "
            "engine.max_context=16384 sequence and one 64-token page per lane, at most what "
            "engine.max_concurrency=1 lanes can use)"
        ),
    }
    for argv, expected in cases.items():
        assert cli.main([*argv, "--check-config"]) == 2
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", f"ninfer-serve: error: {expected}\n")


def test_subprocess_errors_are_one_line_with_status_2(tmp_path: Path) -> None:
    for argv, expected in (
        (["--max-concurrency", "9"], "ninfer-serve: error: --max-concurrency=9 (engine.max_concurrency): "),
        (["--spec", "dflash", "--vision"], "ninfer-serve: error: --vision (vision.enabled=true): "),
        (["--bogus"], "ninfer-serve: error: unrecognized arguments: --bogus"),
        (["--port"], "ninfer-serve: error: argument --port: expected one argument"),
    ):
        done = run_cli(*argv, "--check-config", cwd=tmp_path)
        assert done.returncode == 2 and done.stdout == "", argv
        assert done.stderr.count("\n") == 1 and done.stderr.startswith(expected), done.stderr
    env = dict(ENV, NINFER_ENGINE_MAX_CONCURRENCY="0")
    done = run_cli("--check-config", cwd=tmp_path, env=env)
    assert (done.returncode, done.stderr) == (
        2,
        "ninfer-serve: error: engine.max_concurrency=0 (from NINFER_ENGINE_MAX_CONCURRENCY): must be an integer in 1..8\n",
    )
    assert list(tmp_path.iterdir()) == []


def test_subprocess_check_config_prints_resolved_json(tmp_path: Path) -> None:
    env = dict(ENV, NINFER_ENGINE_MAX_CONCURRENCY="4", NINFER_SERVER_PORT="9100")
    done = run_cli(
        "m.ninfer",
        "--device",
        "cpu",
        "--api-key",
        "k3y",
        "--port",
        "9200",
        "--check-config",
        env=env,
        cwd=tmp_path,
    )
    assert (done.returncode, done.stderr) == (0, "")
    dump = json.loads(done.stdout)
    assert dump["engine"]["device"] == "cpu" and dump["engine"]["max_concurrency"] == 4  # env over YAML
    assert dump["server"]["port"] == 9200  # the flag over env
    assert dump["server"]["api_key"] == "<redacted>" and "k3y" not in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_argv_redacted() -> None:
    argv = ["ninfer-serve", "m.ninfer", "--api-key", "s1", "--port", "1", "--api-key=s2", "server.api_key=s3"]
    argv += ["++server.api_key='s4'", "--set", "server.api_key=s5", "--set=server.api_key=s6"]
    assert argv_redacted(argv) == [
        "ninfer-serve",
        "m.ninfer",
        "--api-key",
        "<redacted>",
        "--port",
        "1",
        "--api-key=<redacted>",
        "server.api_key=<redacted>",
        "++server.api_key=<redacted>",
        "--set",
        "server.api_key=<redacted>",
        "--set=server.api_key=<redacted>",
    ]
