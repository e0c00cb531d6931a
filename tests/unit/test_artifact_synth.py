"""Synthetic-weight artifacts: no weight files, the manifest says so, tensors drawn at load time
(deterministic per name, in the released dtypes), and a model built from them runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ninfer.artifact import open_artifact, registry
from ninfer.artifact.cli import main as artifact_cli
from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.shapes import mtp_shapes, text_shapes
from ninfer.artifact.synth import synth, synth_config, write_synthetic
from ninfer.model.cache import ForwardBatch, KVPool, StatePool
from ninfer.model.config import FULL, LINEAR, TextConfig
from ninfer.model.weights import load_model


def _tiny() -> TextConfig:
    return TextConfig(
        family="qwen3_5", vocab_size=248320, hidden_size=32, num_hidden_layers=4,
        layer_types=(LINEAR, LINEAR, LINEAR, FULL), num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, intermediate_size=64, mrope_section=(1, 1, 0), mtp_num_hidden_layers=1,
        eos_token_ids=(248046, 248044),
    )  # fmt: skip


@pytest.fixture(scope="module")
def tiny_synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ident = registry.lookup("qwen3.6-27b")
    assert ident is not None
    out = tmp_path_factory.mktemp("synth") / "tiny.ninfer"
    return write_synthetic(out, _tiny(), ident, seed=7, label="tiny", display="tiny (synthetic weights)")


def test_no_weight_files_and_the_manifest_says_synthetic(tiny_synthetic: Path) -> None:
    assert not (tiny_synthetic / "weights").exists()
    manifest = json.loads((tiny_synthetic / "manifest.json").read_text())
    assert manifest["synthetic_weights"] == {"seed": 7, "dtype": "bfloat16"}
    art = open_artifact(tiny_synthetic, verify=True)
    assert art.synthetic == {"seed": 7, "dtype": "bfloat16"}
    cfg = _tiny()
    assert art.tensor_shapes("text") == text_shapes(cfg)
    assert art.tensor_shapes("mtp") == mtp_shapes(cfg)
    n_alog = sum(1 for n in text_shapes(cfg) if n.endswith("A_log"))
    numel = sum(torch.Size(s).numel() for s in text_shapes(cfg).values())
    assert art.tensor_bytes("text") == manifest["components"]["text"]["bytes"] == 2 * numel + 2 * n_alog * 2


def test_tensors_are_drawn_deterministically_in_released_dtypes(tiny_synthetic: Path) -> None:
    art = open_artifact(tiny_synthetic)
    a, b = art.load_tensors("text"), art.load_tensors("text")
    assert a.keys() == b.keys() == text_shapes(_tiny()).keys()
    for name, t in a.items():
        assert torch.equal(t, b[name]), name
        assert t.dtype == (torch.float32 if name.endswith("A_log") else torch.bfloat16), name
        assert torch.isfinite(t).all(), name
    alog = a["model.layers.0.linear_attn.A_log"]
    assert bool(((alog.exp() >= 1.0) & (alog.exp() < 16.01)).all())
    # distinct names draw distinct values (per-name seeds, not one stream restarted)
    assert not torch.equal(a["model.layers.0.mlp.gate_proj.weight"], a["model.layers.1.mlp.gate_proj.weight"])


def test_a_model_built_from_synthetic_weights_runs(tiny_synthetic: Path) -> None:
    art = open_artifact(tiny_synthetic)
    tensors = {**art.load_tensors("text"), **art.load_tensors("mtp")}
    model = load_model(art.config, tensors, torch.float32, "cpu")
    assert model.mtp is not None
    kv = KVPool.for_config(art.config, 2, torch.float32, torch.device("cpu"))
    states = StatePool.for_config(art.config, 1, torch.float32, torch.device("cpu"))
    ids = torch.tensor([[1, 2, 3, 4]])
    batch = ForwardBatch(
        input_ids=ids,
        positions=torch.arange(4).expand(3, 1, 4).clone(),
        slots=torch.tensor([0]),
        page_table=torch.tensor([[0, 1]], dtype=torch.int32),
        cache_lens=torch.tensor([0]),
        max_kv_len=4,
    )
    logits = model.logits(model(batch, kv, states))
    assert logits.shape == (1, 4, 248320) and torch.isfinite(logits).all()


def test_released_shapes_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = synth(tmp_path / "moe.ninfer", "qwen3.6-35b-a3b", layers=2)
    art = open_artifact(out)
    assert art.model_id == "qwen3.6-35b-a3b" and art.config.is_moe
    assert art.config.num_hidden_layers == 2 and art.config.mtp_num_hidden_layers == 1
    assert art.config.hidden_size == 2048 and art.config.num_experts == 256
    assert artifact_cli(["inspect", str(out)]) == 0
    assert "SYNTHETIC" in capsys.readouterr().out
    full = synth_config("qwen3.6-27b", mtp=False)
    assert full.num_hidden_layers == 64 and full.mtp_num_hidden_layers == 0
    assert full.attention_layers == tuple(range(3, 64, 4))
    with pytest.raises(ArtifactError, match="unknown shape"):
        synth_config("qwen9-1t")
    with pytest.raises(ArtifactError, match="--layers"):
        synth_config("qwen3.6-27b", layers=65)
