"""`--spec dflash` startup: the add-dflash artifact component loads as the drafter; every refusal is
one clear error (missing component, dense family, vision, draft_tokens, lm_head_draft)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from ninfer.artifact import open_artifact
from ninfer.artifact.cli import main as artifact_cli
from ninfer.artifact.convert import convert
from ninfer.bootstrap import load_spec_weights
from ninfer.config import ConfigError
from ninfer.config.loader import load_settings
from ninfer.engine.types import EngineConfigError
from ninfer.model.weights import load_model
from tests.engine.tiny import tiny_model
from tests.speculative.helpers import engine, prompt, request, run_batch
from tests.speculative.test_dflash_engine import DRAFTER, dflash_drafter, drafter_tensors, moe_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from hf_fixtures import make_hf_checkpoint

CONFIG = {
    **DRAFTER,
    "hidden_size": 64,
    "dflash_config": {**DRAFTER["dflash_config"], "target_layer_ids": [0, 1]},
}


def _hf_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Module names -> the checkpoint's (`layers.i.self_attn.*`, `layers.i.mlp.*`)."""
    out = {}
    for n, t in tensors.items():
        parts = n.split(".")
        if parts[0] == "layers":
            sub = "mlp" if parts[2].endswith(("gate_proj", "up_proj", "down_proj")) else "self_attn"
            if "layernorm" not in parts[2]:
                parts.insert(2, sub)
        out[".".join(parts)] = t.contiguous()
    return out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("dflash-art")
    moe = convert(make_hf_checkpoint(root / "hf", "moe", with_mtp=False, seed=2), root / "moe.ninfer")
    drafter = root / "drafter"
    drafter.mkdir()
    save_file(_hf_names(drafter_tensors(1, CONFIG)), str(drafter / "model.safetensors"))
    cfg = CONFIG
    (drafter / "config.json").write_text(json.dumps(cfg))
    return moe, drafter, root


def _spec(method: str | None, k: int | None = None, head: bool = False) -> SimpleNamespace:
    return SimpleNamespace(method=method, draft_tokens=k, lm_head_draft=head)


def test_missing_component_then_add_dflash_loads_the_drafter(artifacts) -> None:
    moe, drafter, _ = artifacts
    art = open_artifact(moe)
    model = load_model(art.config, art.load_tensors("text"), torch.float32, "cpu")
    with pytest.raises(EngineConfigError, match=r"carries no DFlash drafter.*add-dflash"):
        load_spec_weights(_spec("dflash", 4), art, model, torch.float32, "cpu")
    assert artifact_cli(["add-dflash", str(moe), str(drafter)]) == 0
    art = open_artifact(moe, verify=True)
    assert art.has_component("dflash")
    drafters = load_spec_weights(_spec("dflash", 4), art, model, torch.float32, "cpu")
    assert drafters.draft_head is None and drafters.dflash is not None
    want = drafter_tensors(1, CONFIG)
    assert all(torch.equal(drafters.dflash.state_dict()[n], t) for n, t in want.items())
    with pytest.raises(EngineConfigError, match="lm_head_draft applies to spec mtp only"):
        load_spec_weights(_spec("dflash", 4, head=True), art, model, torch.float32, "cpu")
    plain = load_model(art.config, art.load_tensors("text"), torch.float32, "cpu")
    reqs = [request(prompt(40 + 9 * i, i), max_tokens=12) for i in range(3)]
    ref, spec = engine(plain), engine(model, dflash=drafters.dflash, spec_method="dflash", draft_tokens=7)
    try:
        assert [t for t, _, _ in run_batch(spec, reqs)] == [t for t, _, _ in run_batch(ref, reqs)]
    finally:
        ref.shutdown(5)
        spec.shutdown(5)


def test_add_dflash_refuses_a_drafter_that_does_not_fit(artifacts) -> None:
    moe, _, root = artifacts
    bad = root / "bad"
    bad.mkdir(exist_ok=True)
    save_file(_hf_names(drafter_tensors(1, CONFIG)), str(bad / "model.safetensors"))
    cfg = {**CONFIG, "dflash_config": {**CONFIG["dflash_config"], "target_layer_ids": [0, 9]}}
    (bad / "config.json").write_text(json.dumps(cfg))
    assert artifact_cli(["add-dflash", str(moe), str(bad)]) != 0


def test_engine_refusals() -> None:
    with pytest.raises(EngineConfigError, match="dflash needs a qwen3_5_moe"):
        engine(tiny_model(512), spec_method="dflash", draft_tokens=4)
    with pytest.raises(EngineConfigError, match="no DFlash drafter loaded"):
        engine(moe_model(), spec_method="dflash", draft_tokens=4)
    target, drafter = moe_model(), dflash_drafter()
    for k in (0, 16):
        with pytest.raises(EngineConfigError, match=r"1\.\.15 with spec dflash"):
            engine(target, dflash=drafter, spec_method="dflash", draft_tokens=k)
    with pytest.raises(EngineConfigError, match="lm_head_draft applies to spec mtp only"):
        engine(target, dflash=drafter, spec_method="dflash", draft_tokens=4, lm_head_draft=True)
    with pytest.raises(EngineConfigError, match=r"a DFlash drafter was given but spec\.method is not dflash"):
        engine(target, dflash=drafter, spec_method="mtp", draft_tokens=4)
    assert dataclasses.is_dataclass(drafter.cfg)


def test_vision_is_refused_with_dflash(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("NINFER_"):
            monkeypatch.delenv(name)
    with pytest.raises(ConfigError, match="DFlash is text-only"):
        load_settings(["spec.method=dflash", "vision.enabled=true"])
