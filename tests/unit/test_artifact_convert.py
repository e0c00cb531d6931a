"""Round trips Hugging Face checkpoint -> .ninfer: every source tensor arrives bit-exact under its canonical name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from hf_fixtures import make_hf_checkpoint, read_hf_tensors

from ninfer.artifact import open_artifact
from ninfer.artifact.convert import convert
from ninfer.model.config import TextConfig
from ninfer.templates import read_template

_EXPERT = re.compile(r"^(.+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")

CASES = {
    "dense": dict(kind="dense"),
    "dense-nomtp-vl-sharded": dict(kind="dense", with_mtp=False, vl=True, sharded=True),
    "dense-mtpfile-tokcfg": dict(kind="dense", mtp_separate_file=True, template_in_tokenizer_config=True),
    "moe": dict(kind="moe"),
    "moe-nomtp": dict(kind="moe", with_mtp=False),
    "moe-perexpert-mtpfile-sharded-bf16": dict(
        kind="moe", per_expert_keys=True, mtp_separate_file=True, sharded=True, dtype=torch.bfloat16
    ),
    "moe-vl-perexpert": dict(kind="moe", vl=True, per_expert_keys=True),
}


def _component_and_name(hf_name: str) -> tuple[str, str]:
    """The documented mapping (docs/artifact.md), written out independently of the converter."""
    if hf_name.startswith("model.visual."):
        return "vision", hf_name[len("model.") :]
    if hf_name.startswith("mtp."):
        return "mtp", hf_name
    return "text", hf_name.replace("model.language_model.", "model.", 1)


def assert_round_trip(hf_dir: Path, art_dir: Path, cast: torch.dtype | None = None) -> None:
    art = open_artifact(art_dir, verify=True)
    loaded = {c: art.load_tensors(c) for c in ("text", "mtp", "vision") if art.has_component(c)}
    used: dict[str, set[str]] = {c: set() for c in loaded}
    for hf_name, src in read_hf_tensors(hf_dir).items():
        if cast is not None:
            src = src.to(cast)
        comp, name = _component_and_name(hf_name)
        if m := _EXPERT.match(name):
            e, part = int(m[2]), m[3]
            fused_name = f"{m[1]}.{'down_proj' if part == 'down' else 'gate_up_proj'}"
            fused = loaded[comp][fused_name]
            ie = fused.shape[1] // 2
            got = {"gate": fused[e, :ie], "up": fused[e, ie:], "down": fused[e]}[part]
            used[comp].add(fused_name)
        else:
            got = loaded[comp][name]
            used[comp].add(name)
        assert got.dtype == src.dtype, hf_name
        assert torch.equal(got, src), hf_name
    for comp, tensors in loaded.items():
        assert used[comp] == set(tensors), f"{comp}: artifact tensors without a source"


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip(tmp_path: Path, case: str) -> None:
    hf = make_hf_checkpoint(tmp_path / "hf", **CASES[case])
    out = convert(hf, tmp_path / "out.ninfer")
    assert_round_trip(hf, out)
    art = open_artifact(out)
    kw = CASES[case]
    assert art.has_component("mtp") == kw.get("with_mtp", True)
    assert art.has_component("vision") == kw.get("vl", False)
    assert art.config.mtp_num_hidden_layers == (1 if kw.get("with_mtp", True) else 0)
    hf_cfg = json.loads((hf / "config.json").read_text())
    want = TextConfig.from_hf(hf_cfg, json.loads((hf / "generation_config.json").read_text()))
    assert art.config == want
    assert art.family == ("qwen3_5_moe" if kw["kind"] == "moe" else "qwen3_5")
    assert art.chat_template == read_template("qwen3_6")
    assert art.generation["eos_token_ids"] == [248046, 248044]
    assert art.generation["sampler"] == {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
    assert art.model_id == "hf" and art.manifest.identity.source == "hf"
    assert art.tokenizer_path.is_file()


@pytest.mark.parametrize("case", ["dense-nomtp-vl-sharded", "moe-perexpert-mtpfile-sharded-bf16"])
def test_text_matches_transformers_loading(tmp_path: Path, case: str) -> None:
    """transformers' own loader (prefix change, per-expert fusion) yields exactly the artifact's text tensors."""
    from transformers import AutoModelForCausalLM

    hf = make_hf_checkpoint(tmp_path / "hf", **CASES[case])
    art = open_artifact(convert(hf, tmp_path / "out.ninfer"))
    text = art.load_tensors("text")
    ref = AutoModelForCausalLM.from_pretrained(hf, dtype="auto").state_dict()
    assert set(ref) == set(text)
    for name, t in ref.items():
        assert torch.equal(t, text[name].to(t.dtype)), name


def test_tied_embeddings_and_dtype_cast(tmp_path: Path) -> None:
    hf = make_hf_checkpoint(tmp_path / "hf", "dense", tie_word_embeddings=True)
    assert "lm_head.weight" not in read_hf_tensors(hf)
    out = convert(hf, tmp_path / "out.ninfer", dtype="bfloat16")
    text = open_artifact(out, verify=True).load_tensors("text")
    assert torch.equal(text["lm_head.weight"], text["model.embed_tokens.weight"])
    src = read_hf_tensors(hf)
    assert all(t.dtype == torch.bfloat16 for t in text.values())
    assert torch.equal(
        text["model.layers.0.linear_attn.A_log"], src["model.layers.0.linear_attn.A_log"].bfloat16()
    )


def test_sharded_output_and_names(tmp_path: Path) -> None:
    hf = make_hf_checkpoint(tmp_path / "My-Model", "moe", sharded=True)
    out = convert(hf, tmp_path / "out.ninfer", max_shard_bytes=200_000)
    art = open_artifact(out, verify=True)
    files = art.manifest.components["text"].files
    n = len(files)
    assert n > 2
    assert list(files) == [f"weights/text-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert art.model_id == "my-model" and art.manifest.identity.display_name == "My-Model"
    assert art.manifest.components["text"].bytes == art.tensor_bytes("text")
    assert_round_trip(hf, out)


def test_model_id_and_hf_cache_source(tmp_path: Path) -> None:
    snap = tmp_path / "models--Qwen--Qwen3.6-27B" / "snapshots" / "0123abcd"
    hf = make_hf_checkpoint(snap, "dense", with_mtp=False, template=None)
    out = convert(hf, tmp_path / "a.ninfer", template="qwen3_5")
    art = open_artifact(out)
    assert art.model_id == "qwen3.6-27b"  # directory name (tiny shapes match no registry entry)
    assert art.manifest.identity.source == "Qwen/Qwen3.6-27B@0123abcd"
    assert art.chat_template == read_template("qwen3_5")
    out2 = convert(hf, tmp_path / "b.ninfer", template="qwen3_6", model_id="qwen3.6-35b-a3b")
    art2 = open_artifact(out2)
    assert art2.model_id == "qwen3.6-35b-a3b" and art2.manifest.identity.display_name == "Qwen3.6-35B-A3B"


def test_given_tokenizer_is_copied(tmp_path: Path) -> None:
    hf = make_hf_checkpoint(tmp_path / "hf", "dense", with_mtp=False, with_tokenizer=True)
    (hf / "tokenizer.json").write_bytes((hf / "tokenizer.json").read_bytes() + b" ")
    art = open_artifact(convert(hf, tmp_path / "out.ninfer"), verify=True)
    assert art.tokenizer_path.read_bytes() == (hf / "tokenizer.json").read_bytes()
