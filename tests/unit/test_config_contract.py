"""Every server option of the serving contract: its flag, settings key, default and valid range."""

from __future__ import annotations

import json

import pytest
import yaml

from ninfer.config import Settings, load_settings
from ninfer.config.groups import GROUPS
from ninfer.config.loader import conf_dir
from ninfer.config.options import CONTRACT_OPTIONS
from ninfer.service.cli import main

# Written out by hand from the "Server options" table of spec/serving-contract.md:
# (flag, settings key, default setting, a valid argument, its parsed value, invalid arguments).
# Switches have argument None and set the key to the parsed value.
VALUED = [
    ("--host", "server.host", "127.0.0.1", "0.0.0.0", "0.0.0.0", [""]),
    ("--port", "server.port", 8080, "9000", 9000, ["0", "65536", "http"]),
    ("--model-id", "server.model_id", None, "qwen3.6-27b", "qwen3.6-27b", [""]),
    ("--max-context", "engine.max_context", 8192, "16384", 16384, ["0", "-5", "1.5"]),
    ("--kv-capacity", "kv.capacity", None, "auto", "auto", ["0", "lots"]),
    ("--max-concurrency", "engine.max_concurrency", 1, "8", 8, ["0", "9"]),
    ("--max-pending-requests", "engine.max_pending_requests", 16, "0", 0, ["-1"]),
    ("--pending-timeout-ms", "engine.pending_timeout_ms", 30000, "250", 250, ["0"]),
    ("--prefill-chunk", "engine.prefill_chunk", 1024, "512", 512, ["0"]),
    ("--log-stats-interval-ms", "logging.log_stats_interval_ms", 5000, "0", 0, ["-1"]),
    ("--device", "engine.device", 0, "1", 1, ["-1", "gpu"]),
    ("--max-request-mib", "server.max_request_mib", 384, "1", 1, ["0"]),
    ("--media-cache-mib", "vision.media_cache_mib", 1024, "0", 0, ["-1"]),
    ("--media-live-mib", "vision.media_live_mib", 2048, "4096", 4096, ["0"]),
    ("--media-preprocess-threads", "vision.media_preprocess_threads", 0, "4", 4, ["-1"]),
    ("--request-log-jsonl", "logging.request_log_jsonl", None, "/tmp/r.jsonl", "/tmp/r.jsonl", [""]),
    ("--response-store-max-records", "server.response_store_max_records", 1024, "10", 10, ["0"]),
    ("--response-store-max-mib", "server.response_store_max_mib", 256, "1", 1, ["0"]),
    ("--kv-dtype", "kv.dtype", "bf16", "int8", "int8", ["fp8"]),
    ("--spec", "spec.method", None, "dflash", "dflash", ["eagle"]),
    ("--default-max-tokens", "engine.default_max_tokens", 8192, "16", 16, ["0"]),
    ("--cold-tier-device", "cold_tier.device", -1, "1", 1, ["-2"]),
    ("--cold-tier-capacity-mib", "cold_tier.capacity_mib", 0, "1024", 1024, ["-1"]),
    ("--cold-tier-staging-mib", "cold_tier.staging_mib", 64, "128", 128, ["0"]),
    ("--temperature", "sampling.temperature", None, "0.7", 0.7, ["-0.1", "2.5", "nan", "inf"]),
    ("--top-p", "sampling.top_p", None, "0.95", 0.95, ["1.5", "-0.1"]),
    ("--top-k", "sampling.top_k", None, "20", 20, ["-1", "2.5"]),
    ("--min-p", "sampling.min_p", None, "0", 0.0, ["1.1"]),
    ("--presence-penalty", "sampling.presence_penalty", None, "1.5", 1.5, ["2.5", "-3"]),
    ("--frequency-penalty", "sampling.frequency_penalty", None, "-0.5", -0.5, ["3"]),
    ("--seed", "sampling.seed", None, "42", 42, ["-1", "x"]),
]
SWITCHES = [
    ("--vision", "vision.enabled", False, True),
    ("--no-cuda-graph", "engine.no_cuda_graph", False, True),
    ("--no-prefix-reuse", "engine.no_prefix_reuse", False, True),
    ("--no-cold-tier", "cold_tier.enabled", True, False),
    ("--no-thinking", "sampling.no_thinking", False, True),
    ("--preserve-thinking", "sampling.preserve_thinking", False, True),
    ("--cors", "server.cors", False, True),
    ("--greedy", "sampling.greedy", False, True),
]
# options that only make sense together with --spec: checked with --spec mtp
NEEDS_SPEC = [
    ("--draft-tokens", "spec.draft_tokens", None, "5", 5, ["0", "6"]),
]
SECRET = ("--api-key", "server.api_key", None)
CONTRACT_FLAGS = (
    [row[0] for row in VALUED]
    + [row[0] for row in SWITCHES]
    + ["--draft-tokens", "--lm-head-draft", "--api-key"]
)


def get(settings: Settings, key: str) -> object:
    group, field = key.split(".")
    return getattr(getattr(settings, group), field)


def check(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main([*argv, "--check-config"])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_table_covers_exactly_the_contract_flags() -> None:
    assert sorted(o.flag for o in CONTRACT_OPTIONS) == sorted(CONTRACT_FLAGS)
    assert len(CONTRACT_FLAGS) == len(set(CONTRACT_FLAGS)) == 42


def test_defaults_match_the_contract() -> None:
    settings = load_settings()
    for flag, key, default, *_ in VALUED + NEEDS_SPEC:
        assert get(settings, key) == default, flag
    for flag, key, default, _ in SWITCHES:
        assert get(settings, key) is default, flag
    assert settings.server.api_key is None
    assert settings.spec.lm_head_draft is False
    assert settings.kv_capacity_tokens == 8192  # omitted --kv-capacity follows --max-context
    assert settings.model.artifact is None  # the demo artifact


@pytest.mark.parametrize(("flag", "key", "default", "arg", "parsed", "bad"), VALUED)
def test_valued_flag_sets_its_key(flag, key, default, arg, parsed, bad, capsys) -> None:
    code, out, err = check([flag, arg], capsys)
    assert (code, err) == (0, "")
    group, field = key.split(".")
    assert json.loads(out)[group][field] == parsed


@pytest.mark.parametrize(("flag", "key", "default", "arg", "parsed", "bad"), VALUED + NEEDS_SPEC)
def test_valued_flag_rejects_out_of_range(flag, key, default, arg, parsed, bad, capsys) -> None:
    extra = ["--spec", "mtp"] if (flag, key) == ("--draft-tokens", "spec.draft_tokens") else []
    for value in bad:
        code, out, err = check([*extra, f"{flag}={value}"], capsys)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and err.startswith("ninfer-serve: error: "), err
        shown = repr(value) if value == "" else value
        assert f"{flag}={shown} ({key}): must be" in err, err


@pytest.mark.parametrize(("flag", "key", "default", "parsed"), SWITCHES)
def test_switch_sets_its_key(flag, key, default, parsed, capsys) -> None:
    code, out, _ = check([flag], capsys)
    group, field = key.split(".")
    assert code == 0 and json.loads(out)[group][field] is parsed


def test_spec_dependent_flags(capsys) -> None:
    code, out, _ = check(["--spec", "mtp", "--draft-tokens", "5", "--lm-head-draft"], capsys)
    assert code == 0
    assert json.loads(out)["spec"] == {"method": "mtp", "draft_tokens": 5, "lm_head_draft": True}
    code, out, _ = check(["--spec", "dflash", "--draft-tokens", "15"], capsys)
    assert code == 0 and json.loads(out)["spec"]["draft_tokens"] == 15


def test_api_key_is_set_and_never_printed(capsys) -> None:
    code, out, _ = check(["--api-key", "s3cret-value"], capsys)
    assert code == 0 and "s3cret-value" not in out
    assert json.loads(out)["server"]["api_key"] == "<redacted>"
    settings = load_settings(["server.api_key='s3cret-value'"])
    assert settings.server.api_key is not None
    assert settings.server.api_key.get_secret_value() == "s3cret-value"
    assert "s3cret-value" not in repr(settings) and "s3cret-value" not in str(settings.model_dump())
    code, _, err = check(["--api-key="], capsys)
    assert (
        code == 2
        and err
        == "ninfer-serve: error: --api-key=<redacted> (server.api_key): must be a non-empty string or null\n"
    )


def test_exact_messages(capsys) -> None:
    cases = {
        (
            "--max-concurrency",
            "9",
        ): "--max-concurrency=9 (engine.max_concurrency): must be an integer in 1..8",
        ("--kv-dtype", "fp8"): "--kv-dtype=fp8 (kv.dtype): must be one of bf16, int8",
        (
            "--temperature",
            "3",
        ): "--temperature=3 (sampling.temperature): must be a finite number in [0, 2] or null",
        ("--device", "gpu"): "--device=gpu (engine.device): must be a CUDA device index >= 0 or cpu",
    }
    for argv, expected in cases.items():
        code, _, err = check(list(argv), capsys)
        assert (code, err) == (2, f"ninfer-serve: error: {expected}\n")


def test_device_cpu_is_accepted() -> None:
    settings = load_settings(["engine.device=cpu"])
    assert settings.engine.device == "cpu"
    assert settings.engine.torch_device(cuda_available=True) == "cpu"
    assert load_settings().engine.torch_device(cuda_available=False) == "cpu"
    assert load_settings(["engine.device=1"]).engine.torch_device(cuda_available=True) == "cuda:1"
    assert settings.engine.torch_dtype(on_gpu=False) == "float32"
    assert settings.engine.torch_dtype(on_gpu=True) == "bfloat16"
    assert load_settings(["engine.dtype=float32"]).engine.torch_dtype(on_gpu=True) == "float32"


def test_every_default_lives_in_the_models_and_conf_holds_only_presets() -> None:
    root = conf_dir()
    assert sorted(p.name for p in root.iterdir()) == ["config.yaml", "preset"]
    config = yaml.safe_load((root / "config.yaml").read_text())
    assert config["defaults"][0] == "ninfer_defaults"
    for path in (root / "preset").glob("*.yaml"):  # a preset overlays values, it adds no keys
        for group, values in (yaml.safe_load(path.read_text()) or {}).items():
            assert set(values) <= set(GROUPS[group].model_fields), path.name
    composed = load_settings()
    for name, model in GROUPS.items():
        for field, info in model.model_fields.items():
            value = getattr(getattr(composed, name), field)
            assert value == info.default, f"{name}.{field}"


def test_default_thinking_budget_flag(capsys) -> None:
    code, out, _ = check(["--default-thinking-budget", "256"], capsys)
    assert code == 0 and json.loads(out)["sampling"]["default_thinking_budget"] == 256
    code, out, err = check(["--default-thinking-budget=0"], capsys)
    assert code == 2 and "--default-thinking-budget=0 (sampling.default_thinking_budget): must be" in err
