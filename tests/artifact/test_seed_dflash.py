"""A seed file's DFlash companion (v2 and v3, written by `seed_writer` from a tiny random drafter as
the 35B-A3B reference §8 / §13.3 stores it: W8 matrices, [q ; k ; v] and [gate ; up] parents) loads
as our DFlash drafter: its weights equal the writer's dequantized ones, speculation with it gives
the greedy tokens of speculation off, `import` writes it as our `dflash` component; a companion
with a missing or misshapen tensor is refused naming it, and one whose config neither the file nor
the seed's documents give leaves `--spec dflash` refused naming the missing field."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ninfer.artifact import open_artifact
from ninfer.artifact.cli import main as artifact_main
from ninfer.artifact.seed_container import SeedFormatError
from ninfer.artifact.seed_dflash import V2_DFLASH, V2_FACTS
from ninfer.artifact.seed_layouts import V2_MODELS
from ninfer.model.dflash import DFlashConfig, DFlashDrafter
from tests.artifact.seed_writer import build

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from hf_fixtures import make_hf_checkpoint

MOE_ID = "tiny-seed-moe"
# a drafter for the tiny MoE target (hidden 64, 4 layers, vocab 512): one sliding-window layer of
# window 8 and one full layer, all non-causal as the seed's 35B-A3B companion (model reference §9)
CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "layer_types": ["sliding_attention", "full_attention"],
    "use_sliding_window": True,
    "sliding_window": 8,
    "is_causal": False,
    "dflash_config": {"block_size": 16, "target_layer_ids": [0, 2], "mask_token_id": 500},
}


def _checkpoint_names(cfg: dict[str, Any], seed: int = 1) -> dict[str, torch.Tensor]:
    """A random drafter's tensors under the drafter checkpoint's names (`layers.i.self_attn.*`)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, t in DFlashDrafter(DFlashConfig.from_hf(cfg)).state_dict().items():
        parts = n.split(".")
        if parts[0] == "layers" and "layernorm" not in parts[2]:
            parts.insert(
                2, "mlp" if parts[2].endswith(("gate_proj", "up_proj", "down_proj")) else "self_attn"
            )
        out[".".join(parts)] = (1.0 if t.dim() == 1 else 0.0) + 0.2 * torch.randn(t.shape, generator=g)
    return out


def _module(name: str) -> str:
    """`dflash.` + a checkpoint name -> the drafter module's state_dict name."""
    return name.removeprefix("dflash.").replace(".self_attn.", ".").replace(".mlp.", ".")


@pytest.fixture(scope="module")
def hf_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_checkpoint(tmp_path_factory.mktemp("seed-dflash") / "moe", "moe", seed=5, with_mtp=False)


@pytest.fixture(autouse=True)
def registered(hf_moe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A v2 file carries no config: the tiny model id is registered with its text config and, as the
    seed documents the 35B-A3B's, its DFlash facts the shapes do not give."""
    monkeypatch.setitem(V2_MODELS, MOE_ID, json.loads((hf_moe / "config.json").read_text()))
    cfg = DFlashConfig.from_hf(CONFIG)
    facts = {f: list(v) if isinstance(v := getattr(cfg, f), tuple) else v for f in V2_FACTS}
    monkeypatch.setitem(V2_DFLASH, MOE_ID, {**facts, "num_hidden_layers": 2, "head_dim": 16})


def _build(hf: Path, out: Path, version: int, tensors: dict[str, torch.Tensor] | None = None, **kw: Any):  # type: ignore[no-untyped-def]
    return build(
        hf, out, version, "moe", model_id=MOE_ID, dflash=(CONFIG, tensors or _checkpoint_names(CONFIG)), **kw
    )


@pytest.mark.parametrize("version", [2, 3])
def test_the_dflash_companion_of_a_seed_file_is_the_dflash_drafter(hf_moe, tmp_path, capsys, version) -> None:
    from ninfer.bootstrap import load_spec_weights, spec_fields
    from ninfer.formats import QuantWeight
    from ninfer.model.weights import load_model
    from tests.speculative.helpers import assert_speculation_exact

    original = _checkpoint_names(CONFIG)
    files, ref = _build(hf_moe, tmp_path / "d.ninfer", version, original)
    art = open_artifact(files[0])
    assert art.has_component("dflash") and art.not_loaded("dflash") is None
    assert art.dflash_config() == DFlashConfig.from_hf(CONFIG)
    stored = art.load_tensors("dflash")
    q, k = stored["layers.1.self_attn.q_proj.weight"], stored["layers.1.self_attn.k_proj.weight"]
    assert isinstance(q, QuantWeight) and q.fmt.name == "q8_g32"  # the W8 rows as stored
    if version == 2:  # rows of one parent in the mapped file: the same storage
        assert q.base.untyped_storage().data_ptr() == k.base.untyped_storage().data_ptr()
    spec = SimpleNamespace(method="dflash", draft_tokens=4, lm_head_draft=False)
    spec_model = load_model(art.config, art.load_tensors("text"), torch.float32, "cpu")
    drafter = load_spec_weights(spec, art, spec_model, torch.float32, "cpu").dflash
    assert drafter is not None
    got = drafter.state_dict()
    want = {_module(n): t for n, t in ref.items() if n.startswith("dflash.")}
    assert set(got) == set(want)
    for n, t in want.items():
        assert torch.equal(got[n], t), n
    assert not torch.equal(want["fc.weight"], original["fc.weight"])  # W8 did change the weights

    assert artifact_main(["inspect", str(files[0])]) == 0
    shown = capsys.readouterr().out
    assert "dflash        drafter of 2 layers, hidden 64, heads 4/2 x 16, FFN 96" in shown
    assert "features of target layers [0, 2], block 16, mask id 500" in shown and "non-causal" in shown
    assert artifact_main(["import", str(files[0]), str(tmp_path / "ours")]) == 0  # our component
    ours = open_artifact(tmp_path / "ours", verify=True)
    assert ours.dflash_config() == DFlashConfig.from_hf(CONFIG)
    assert isinstance(ours.load_tensors("dflash")["fc.weight"], QuantWeight)  # W8 kept
    again = load_spec_weights(spec, ours, spec_model, torch.float32, "cpu").dflash
    assert again is not None and all(torch.equal(again.state_dict()[n], t) for n, t in want.items())

    plain = load_model(art.config, art.load_tensors("text"), torch.float32, "cpu")
    assert_speculation_exact(plain, spec_model, None, dflash=drafter, **spec_fields(spec))


def _drop_binding(doc: dict, name: str) -> None:
    doc["bindings"].pop(name)
    doc["uses"] = [u for u in doc["uses"] if u["parameter"] != name]


def _misshapen() -> dict[str, torch.Tensor]:
    t = _checkpoint_names(CONFIG)
    t["layers.1.mlp.down_proj.weight"] = t["layers.1.mlp.down_proj.weight"][:, :80].contiguous()
    return t


KEY_NORM = "dflash/layers/1/attention/key_norm"
MALFORMED = {
    (2, "missing"): f"the DFlash companion has no object {KEY_NORM!r}",
    (3, "missing"): f"no binding for parameter {KEY_NORM!r}",
    (
        2,
        "shape",
    ): r"DFlash object 'dflash/layers/1/mlp/down': shape \[64, 80\], the drafter's .* is \[64, 96\]",
    (3, "shape"): r"parameter 'dflash/layers/1/mlp/down' has 5120 elements, the model's \[64, 96\] has 6144",
}


@pytest.mark.parametrize(("version", "fault"), sorted(MALFORMED))
def test_a_malformed_dflash_companion_is_refused_by_name(hf_moe, tmp_path, version, fault) -> None:
    from tests.artifact.test_seed_container import _rewrite

    files, _ = _build(hf_moe, tmp_path / "d.ninfer", version, _misshapen() if fault == "shape" else None)
    if fault == "missing" and version == 2:
        _rewrite(files[0], lambda d: next(o for o in d["objects"] if o["name"] == KEY_NORM).update(name="x"))
    elif fault == "missing":
        _rewrite(files[0], lambda d: _drop_binding(d, KEY_NORM))
    with pytest.raises(SeedFormatError, match=MALFORMED[version, fault]):
        open_artifact(files[0])
    assert artifact_main(["inspect", str(files[0])]) == 2


@pytest.mark.parametrize(
    ("version", "missing"),
    [(2, "target_layer_ids"), (2, "mask_token_id"), (3, "mask_token_id"), (3, "num_hidden_layers")],
)
def test_a_dflash_config_neither_the_file_nor_the_docs_give_is_refused_naming_the_field(
    hf_moe, tmp_path, monkeypatch, capsys, version, missing
) -> None:
    """v2: no facts documented for the model (or one missing); v3: the component's config lacks the
    field. The file still opens (the text model serves); `--spec dflash` fails the artifact settings
    check (the one the server and `ninfer` run before binding a port or loading a weight: exit 2)."""
    from ninfer.config import ConfigError, check_artifact_settings, load_settings

    config = CONFIG
    if version == 2 and missing == "target_layer_ids":
        monkeypatch.delitem(V2_DFLASH, MOE_ID)
    elif version == 2:
        monkeypatch.setitem(V2_DFLASH, MOE_ID, {k: v for k, v in V2_DFLASH[MOE_ID].items() if k != missing})
    elif missing == "mask_token_id":
        config = {**CONFIG, "dflash_config": {"block_size": 16, "target_layer_ids": [0, 2]}}
    else:
        config = {k: v for k, v in CONFIG.items() if k != missing}
    files, _ = build(hf_moe, tmp_path / "d.ninfer", version, "moe", model_id=MOE_ID,
                     dflash=(config, _checkpoint_names(CONFIG)))  # fmt: skip
    art = open_artifact(files[0])
    assert not art.has_component("dflash") and art.has_component("text")
    why = art.not_loaded("dflash")
    assert why is not None and missing in why and why.endswith("drop --spec dflash")
    with pytest.raises(ConfigError, match=f"spec.method=dflash: .*{missing}"):
        check_artifact_settings(load_settings(["spec.method=dflash"]), art)
    assert artifact_main(["inspect", str(files[0])]) == 0
    assert "dflash        NOT LOADED: " in capsys.readouterr().out


def test_the_35b_a3b_inventory_gives_the_documented_drafter() -> None:
    """The shapes of the 35B-A3B reference §8 (a directory without payload: only shapes are read)
    and the facts it fixes (§2) make the companion's config (model reference §2.6): the numbers
    our v2 derivation and `V2_DFLASH` carry agree with each other and with the seed's text model."""
    from ninfer.artifact.seed_container import SeedFile, SeedObject
    from ninfer.artifact.seed_dflash import dflash_config, v2_geometry
    from ninfer.model.config import TextConfig

    shapes = {"dflash/feature_projection": (2048, 16384), "dflash/context_norm": (2048,),
              "dflash/final_norm": (2048,)}  # fmt: skip
    for i in range(6):
        d = f"dflash/layers/{i}/"
        shapes |= {d + "input_norm": (2048,), d + "attention/query_key_value": (6144, 2048),
                   d + "attention/query_norm": (128,), d + "attention/key_norm": (128,),
                   d + "attention/output": (2048, 4096), d + "post_attention_norm": (2048,),
                   d + "mlp/gate_up": (12288, 2048), d + "mlp/down": (2048, 6144)}  # fmt: skip
    objects = {n: SeedObject(n, "tensor", 0, 1, s, "bf16", "contiguous_le_v1") for n, s in shapes.items()}
    sf = SeedFile(Path("35b.ninfer"), 2, "qwen3.6-35b-a3b", "groupwise-int", None, objects, {}, {}, [], [])
    text = TextConfig.from_hf(V2_MODELS["qwen3.6-35b-a3b"], {})
    cfg, source = dflash_config(sf, text, v2_geometry(sf))
    assert cfg is not None, source
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (6, 2048, 6144)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (32, 8, 128)
    assert cfg.target_layer_ids == (1, 6, 11, 16, 22, 27, 32, 37) and cfg.mask_token_id == 248077
    assert cfg.layer_types == ("sliding_attention",) * 5 + ("full_attention",) and cfg.sliding_window == 4096
    assert cfg.is_causal is False and cfg.rope_theta == 1e7 and cfg.block_size == 16
    assert DFlashConfig.from_hf(cfg.to_hf()) == cfg  # what `import` writes reads back the same
    with torch.device("meta"):  # the private parameter count of model reference §2.6
        assert sum(t.numel() for t in DFlashDrafter(cfg).state_dict().values()) == 385_906_176
