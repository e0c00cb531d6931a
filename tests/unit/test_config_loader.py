"""The Hydra -> Settings bridge: presets, env precedence, cross-field rules, no files, no chdir."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ninfer.config import ConfigError, Settings, check_against_artifact, load_settings
from ninfer.config.loader import _compose, _composed, conf_dir, group_options, settings_from_tree
from ninfer.config.options import hydra_quote

PRESETS = {
    # name: (artifact, spec method, draft tokens, lm-head draft)
    "demo": (None, None, None, False),
    "qwen27b": ("/models/qwen3_6_27b.ninfer", None, None, False),
    "qwen27b_mtp": ("/models/qwen3_6_27b.ninfer", "mtp", 3, True),
    "qwen35b_mtp": ("/models/qwen3_6_35b_a3b.ninfer", "mtp", 3, True),
    "qwen35b_dflash": ("/models/qwen3_6_35b_a3b.ninfer", "dflash", 15, False),
    "qwen38_27b_mtp": ("/models/qwen3_8_27b.ninfer", "mtp", 3, True),
}


def error_of(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(overrides)
    text = str(info.value)
    assert "\n" not in text
    return text


@pytest.fixture(autouse=True)
def _no_ninfer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("NINFER_"):
            monkeypatch.delenv(name)


def test_presets_load_and_the_artifact_can_be_overridden() -> None:
    assert group_options("preset") == sorted(PRESETS)
    for name, (artifact, method, draft, head) in PRESETS.items():
        settings = load_settings([f"+preset={name}"])
        assert settings.model.artifact == artifact
        assert (settings.spec.method, settings.spec.draft_tokens, settings.spec.lm_head_draft) == (
            method,
            draft,
            head,
        )
        assert settings.vision.enabled is False
        moved = load_settings([f"+preset={name}", "model.artifact=/data/m.ninfer"])
        assert moved.model.artifact == "/data/m.ninfer"
    for path in (conf_dir() / "preset").glob("*.yaml"):
        assert path.read_text().startswith("# @package _global_\n"), path


def test_unknown_keys_and_presets_are_one_line() -> None:
    assert error_of(["engine.nope=1"]).startswith(
        "engine.nope=1: unknown key (valid keys of engine: max_context, "
    )
    assert error_of(["+engine.nope=1"]).startswith("engine.nope=1: unknown key")
    assert error_of(["nope.max_context=1"]).startswith(
        "nope.max_context=1: unknown key (valid groups: model, "
    )
    assert error_of(["+preset=nope"]) == (
        "preset=nope: unknown preset (valid: demo, qwen27b, qwen27b_mtp, qwen35b_dflash, qwen35b_mtp, qwen38_27b_mtp)"
    )
    assert error_of(["engine.max_context"]).startswith("invalid override: ")
    assert error_of(["preset=demo"]) == "preset=demo: select a preset with +preset=demo"


def test_cross_field_rules() -> None:
    assert (
        error_of(["spec.draft_tokens=3"]) == "spec.draft_tokens=3: requires spec.method (--spec mtp|dflash)"
    )
    assert (
        error_of(["spec.lm_head_draft=true"])
        == "spec.lm_head_draft=true: requires spec.method (--spec mtp|dflash)"
    )
    assert error_of(["spec.method=mtp", "spec.draft_tokens=6"]) == (
        "spec.draft_tokens=6: must be an integer in 1..5 with spec.method=mtp"
    )
    assert error_of(["spec.method=dflash", "spec.draft_tokens=16"]) == (
        "spec.draft_tokens=16: must be an integer in 1..15 or null"
    )
    assert error_of(["spec.method=dflash", "vision.enabled=true"]) == (
        "vision.enabled=true: cannot be combined with spec.method=dflash (DFlash is text-only)"
    )
    assert load_settings(["spec.method=mtp", "vision.enabled=true"]).vision.enabled is True
    # the KV pool must hold one full sequence: 64-token pages, 8192 max context
    assert error_of(["kv.capacity=8191"]).startswith("kv.capacity=8191: must be an integer in 8192..8192 ")
    assert error_of(["engine.max_context=4096", "kv.capacity=4095"]).startswith(
        "kv.capacity=4095: must be an integer in 4096..4096 "
    )
    assert load_settings(["engine.max_concurrency=4", "kv.capacity=32768"]).kv_capacity_tokens == 32768
    assert error_of(["engine.max_concurrency=4", "kv.capacity=32769"]).startswith(
        "kv.capacity=32769: must be an integer in 8192..32768 "
    )
    # one page per lane: 64 tokens of max context and 2 lanes need at least 65 tokens
    assert error_of(["engine.max_context=64", "engine.max_concurrency=2"]).startswith(
        "kv.capacity=null: must be an integer in 65..128 "
    )
    assert load_settings(["kv.capacity=auto", "engine.max_concurrency=8"]).kv_capacity_tokens is None
    assert error_of(["cold_tier.device=0"]) == (
        "cold_tier.device=0: must be -1 or a secondary device, not engine.device=0"
    )
    assert load_settings(["cold_tier.device=0", "cold_tier.enabled=false"]).cold_tier.device == 0
    assert error_of(["model.artifact=/m/a.ninfer", "logging.request_log_jsonl=/m/../m/a.ninfer"]) == (
        "logging.request_log_jsonl=/m/../m/a.ninfer: must not resolve to model.artifact"
    )


def test_check_against_artifact() -> None:
    dflash = load_settings(["+preset=qwen35b_dflash"])
    check_against_artifact(dflash, "qwen3_5_moe")
    with pytest.raises(ConfigError) as info:
        check_against_artifact(dflash, "qwen3_5")
    assert str(info.value) == (
        "spec.method=dflash: needs the 35B-A3B artifact (family qwen3_5_moe), this artifact is qwen3_5"
    )
    mtp = load_settings(["+preset=qwen27b_mtp", "vision.enabled=true"])
    check_against_artifact(mtp, "qwen3_5", has_mtp=True, has_vision=True, max_position_embeddings=262144)
    for kwargs, key in (
        ({"has_mtp": False}, "spec.method=mtp"),
        ({"has_vision": False}, "vision.enabled=true"),
    ):
        with pytest.raises(ConfigError, match=key):
            check_against_artifact(mtp, "qwen3_5", **kwargs)
    with pytest.raises(ConfigError, match=r"engine.max_context=16384: must be an integer in 1..8192"):
        check_against_artifact(mtp, "qwen3_5", max_position_embeddings=8192)
    with pytest.raises(ConfigError, match=r"^spec.lm_head_draft=true: .*drop --lm-head-draft"):
        check_against_artifact(mtp, "qwen3_5", has_mtp=True, has_lm_head_draft=False)
    check_against_artifact(mtp, "qwen3_5", has_mtp=True, has_lm_head_draft=True)
    with pytest.raises(ConfigError, match=r"^spec.method=dflash: this artifact carries no DFlash drafter"):
        check_against_artifact(dflash, "qwen3_5_moe", has_dflash=False)
    check_against_artifact(dflash, "qwen3_5_moe", has_dflash=True, has_lm_head_draft=False)


def test_env_overrides_yaml_and_explicit_overrides_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NINFER_ENGINE_MAX_CONCURRENCY", "4")
    monkeypatch.setenv("NINFER_KV_CAPACITY", "auto")
    monkeypatch.setenv("NINFER_SERVER_API_KEY", "env-secret")
    settings = load_settings()
    assert settings.engine.max_concurrency == 4 and settings.kv.capacity == "auto"
    assert settings.server.api_key is not None and settings.server.api_key.get_secret_value() == "env-secret"
    assert load_settings(["+preset=qwen27b"]).engine.max_concurrency == 4  # env beats preset YAML too
    assert load_settings(["engine.max_concurrency=2"]).engine.max_concurrency == 2
    assert Settings().engine.max_concurrency == 4  # the models read the same variables
    monkeypatch.setenv("NINFER_ENGINE_MAX_CONCURRENCY", "9")
    assert (
        error_of([])
        == "engine.max_concurrency=9 (from NINFER_ENGINE_MAX_CONCURRENCY): must be an integer in 1..8"
    )
    assert load_settings(["engine.max_concurrency=3"]).engine.max_concurrency == 3


def test_settings_without_env_read_no_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NINFER_ENGINE_NO_CUDA_GRAPH", "true")
    monkeypatch.setenv("NINFER_KV_DTYPE", "int8")
    monkeypatch.setenv("NINFER_SPEC_METHOD", "mtp")
    monkeypatch.setenv("NINFER_SERVER_API_KEX", "hidden-value")  # not even a misspelt one
    settings = settings_from_tree({"engine": {"max_concurrency": 2}}, env=False)
    assert settings.engine.max_concurrency == 2
    assert (settings.engine.no_cuda_graph, settings.kv.dtype, settings.spec.method) == (False, "bf16", None)
    with pytest.raises(ConfigError, match=r"engine\.max_concurrency=9: "):
        settings_from_tree({"engine": {"max_concurrency": 9}}, env=False)


def test_misspelt_env_variable_is_rejected_without_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NINFER_SERVER_API_KEX", "hidden-value")
    text = error_of([])
    assert text.startswith(
        "NINFER_SERVER_API_KEX: unknown environment setting (valid keys of server: host, port, "
    )
    assert "hidden-value" not in text
    monkeypatch.delenv("NINFER_SERVER_API_KEX")
    monkeypatch.setenv("NINFER_CACHE_DIR", "/tmp/elsewhere")  # not a settings group: left alone
    assert load_settings().engine.max_concurrency == 1


def test_cached_composition_matches_hydra() -> None:
    tricky = ["it's", "${x}", "a\\", "\\${y}", "a,b c", "::1", "$", "%s"]
    cases = [
        [],
        ["+preset=qwen35b_mtp", "engine.max_context=4096", "kv.capacity=auto"],
        ["spec.method=null", "engine.device=cpu", "sampling.temperature=0.5"],
        *[["+preset=demo", f"server.host={hydra_quote(t)}", "server.port='81'"] for t in tricky],
    ]
    for overrides in cases:
        fast = OmegaConf.to_container(_composed(overrides), resolve=True)
        full = OmegaConf.to_container(_compose(overrides), resolve=True)
        assert fast == full, overrides
    for text in tricky:
        assert load_settings([f"server.host={hydra_quote(text)}"]).server.host == text


def test_no_files_and_no_chdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    load_settings(["+preset=demo", "server.port=9000", "++hydra.job.name=x"])
    assert Path.cwd() == tmp_path and list(tmp_path.iterdir()) == []


def test_hydra_main_writes_nothing_and_stays_in_place(tmp_path: Path) -> None:
    # the conf/ hydra section governs a @hydra.main entry point: no outputs/, no .hydra/, no log file
    script_dir, run_dir = tmp_path / "script", tmp_path / "run"
    script_dir.mkdir()
    run_dir.mkdir()
    script = script_dir / "entry.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os
            import hydra
            from hydra.core.hydra_config import HydraConfig
            from ninfer.config import settings_from_config

            @hydra.main(version_base="1.3", config_path={str(conf_dir())!r}, config_name="config")
            def run(cfg):
                settings = settings_from_config(cfg, HydraConfig.get().overrides.task)
                print(os.getcwd(), settings.engine.prefill_chunk, settings.model.artifact)

            run()
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("NINFER_")}
    done = subprocess.run(
        [sys.executable, str(script), "+preset=qwen27b", "engine.prefill_chunk=512"],
        cwd=run_dir,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(run_dir), "512", "/models/qwen3_6_27b.ninfer"]
    assert list(run_dir.iterdir()) == [] and sorted(p.name for p in script_dir.iterdir()) == ["entry.py"]
