"""The seed system's `.ninfer` container (v2 and v3): files built by `seed_writer` (its own encoders,
no code shared with the reader) from a tiny random checkpoint. The engine on them equals transformers
run on the writer's dequantized weights (fp32 CPU: logits within 1e-4, greedy tokens equal);
groupwise parents load as views of the file; each broken container rule is refused with a message
naming the object, and `inspect` / `ninfer-serve` exit 2 on it."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from hf_fixtures import make_hf_checkpoint

from ninfer import LLM, SamplingParams
from ninfer.artifact import open_artifact
from ninfer.artifact.cli import main as artifact_main
from ninfer.artifact.seed_container import SeedFormatError
from ninfer.artifact.seed_layouts import V2_MODELS, V2_VISION
from tests.artifact.seed_writer import build

MODEL_ID = "tiny-seed"
MOE_ID = "tiny-seed-moe"
PART_LIMIT = 6_000_000  # splits a tiny v3 file (its 15 MB tokenizer included) into three parts


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_checkpoint(tmp_path_factory.mktemp("seed") / "hf", "dense", seed=3, with_mtp=True)


@pytest.fixture(scope="module")
def frontend() -> dict[str, Any]:
    from ninfer.templates import read_template
    from ninfer.text.builder import cached_tokenizer_json

    return {"tokenizer": Path(cached_tokenizer_json()).read_bytes(), "template": read_template("qwen3_6")}


@pytest.fixture(scope="module")
def hf_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_checkpoint(tmp_path_factory.mktemp("seed") / "moe", "moe", seed=5, with_mtp=True)


@pytest.fixture(autouse=True)
def tiny_model_id(hf_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A v2 file carries no config: its model id names one; the tiny checkpoint's is registered here."""
    monkeypatch.setitem(V2_MODELS, MODEL_ID, json.loads((hf_dir / "config.json").read_text()))


def _build(
    hf_dir: Path, out: Path, version: int, recipe: str, frontend: dict[str, Any]
) -> tuple[list[Path], dict]:
    return build(hf_dir, out, version, recipe, model_id=MODEL_ID, limit=PART_LIMIT, **frontend)


@pytest.mark.parametrize(
    ("version", "recipe"), [(2, "groupwise"), (3, "groupwise"), (2, "nvfp4"), (3, "nvfp4")]
)
def test_engine_on_a_seed_file_matches_transformers(hf_dir, frontend, tmp_path, version, recipe) -> None:
    files, ref = _build(hf_dir, tmp_path / "m.ninfer", version, recipe, frontend)
    assert (len(files) > 1) == (version == 3)  # v3: continuation parts, objects straddling them
    art = open_artifact(files[0])
    assert art.model_id == MODEL_ID and art.has_component("mtp")
    if recipe == "groupwise":
        text = art.load_tensors("text")
        assert art.dequantized_on_load() == []
        q, k = (
            text["model.layers.3.self_attn.query_proj.weight"],
            text["model.layers.3.self_attn.k_proj.weight"],
        )
        assert (
            q.fmt.name == "q4_g64" and text["model.layers.3.self_attn.gate_proj.weight"].fmt.name == "q5_g64"
        )
        if version == 2:  # rows of one parent in the mapped file: the same storage, no copy
            assert q.base.untyped_storage().data_ptr() == k.base.untyped_storage().data_ptr()
    else:  # NVFP4 and row FP8 load as bf16: the reference takes the same rounding
        assert "lm_head.weight" in art.dequantized_on_load()
        exact = ("mtp.", "model.embed_tokens", "A_log", "dt_bias")  # W8 and fp32: loaded as stored
        ref = {n: (t if any(e in n for e in exact) else t.bfloat16().float()) for n, t in ref.items()}
    _same_as_transformers(hf_dir, files[0], ref)


def _same_as_transformers(hf_dir: Path, path: Path, ref: dict[str, torch.Tensor]) -> None:
    """transformers on the dequantized weights `ref` = the engine on the seed file: logits and 16
    greedy tokens of a 60-token prompt (and the formats did change the model)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    prompt = torch.randint(
        0, hf.config.vocab_size, (60,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    with torch.no_grad():
        original = hf(torch.tensor([prompt])).logits[0]
        missing, unexpected = hf.load_state_dict(
            {n: t for n, t in ref.items() if not n.startswith("mtp.")}, strict=False
        )
        assert not unexpected and not missing
        want = hf(torch.tensor([prompt])).logits[0]
        want_gen = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert (original - want).abs().max() / want.abs().max() > 1e-3  # the formats changed the model
    llm = LLM(path)
    got = llm.logits(prompt)
    assert (got - want).abs().max() / want.abs().max() <= 1e-4
    out = llm.generate([prompt], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))[0]
    assert list(out.token_ids) == want_gen[0, len(prompt) :].tolist()


@pytest.mark.parametrize("version", [2, 3])
def test_engine_on_a_moe_seed_file_matches_transformers(
    hf_moe, frontend, tmp_path, monkeypatch, version
) -> None:
    """The 35B-A3B contract: one [q, k, gate, v] and one [q, k, v, z] parent, [a, b] and [router ;
    shared gate] bf16 parents, routed experts as expert-major Q4 / Q5 (Q6) parents, W8 elsewhere."""
    monkeypatch.setitem(V2_MODELS, MOE_ID, json.loads((hf_moe / "config.json").read_text()))
    files, ref = build(hf_moe, tmp_path / "m.ninfer", version, "moe", model_id=MOE_ID, **frontend)
    art = open_artifact(files[0])
    assert art.model_id == MOE_ID and art.has_component("mtp") and art.dequantized_on_load() == []
    text, last = art.load_tensors("text"), len(art.config.layer_types) - 1
    bank = text["model.layers.0.mlp.experts.gate_up_proj"]
    assert bank.fmt.name == "q4_g64" and bank.shape == (8, 64, 64)
    assert text["model.layers.0.mlp.experts.down_proj"].fmt.name == "q5_g64"
    assert text[f"model.layers.{last}.mlp.experts.down_proj"].fmt.name == "q6_g64"
    mtp = art.load_tensors("mtp")
    assert mtp["mtp.layers.0.mlp.experts.down_proj"].fmt.name == "q8_g32"
    _same_as_transformers(hf_moe, files[0], ref)


def test_inspect_and_import(hf_dir, frontend, tmp_path, capsys) -> None:
    files, _ = _build(hf_dir, tmp_path / "m.ninfer", 3, "nvfp4", frontend)
    assert artifact_main(["inspect", str(files[0])]) == 0
    shown = capsys.readouterr().out
    assert "container v3" in shown and "nvfp4" in shown and "DEQUANTIZED TO BF16 AT LOAD" in shown
    assert "bits/weight" in shown and "tokenizer.json" in shown
    src = open_artifact(files[0])
    assert artifact_main(["import", str(files[0]), str(tmp_path / "ours.ninfer")]) == 0
    ours = open_artifact(tmp_path / "ours.ninfer")
    assert ours.model_id == MODEL_ID and ours.chat_template == src.chat_template
    a, b = src.load_tensors("text"), ours.load_tensors("text")
    for name, t in a.items():
        u = b[name]
        assert torch.equal(
            t.dequantize() if hasattr(t, "dequantize") else t,
            u.dequantize() if hasattr(u, "dequantize") else u,
        )
    assert src.media_config("preprocessor_config.json") == ours.media_config("preprocessor_config.json")


@pytest.mark.parametrize("version", [2, 3])
def test_the_vision_tower_of_a_seed_file_matches_transformers(tmp_path, monkeypatch, version) -> None:
    """A VL checkpoint's tower written as the seed stores it (qkv / fc1 Q4, output / fc2 Q5, patch Q6,
    merger W8, [q ; k ; v] and v2 `norm1/weight` names bound onto ours): loaded by `--vision`'s path
    (dense bf16 weights) it equals transformers' `model.visual` on the writer's dequantized weights
    (fp32), and an image request through the engine gives transformers' greedy tokens."""
    from ninfer.bootstrap import vision_tower
    from ninfer.engine.config import EngineConfig
    from ninfer.model.weights import load_model
    from tests.vision.hf_tiny import hf_vl_model
    from tests.vision.vl_engine import (
        IDS,
        TOP,
        VL,
        _sharpen,
        generate,
        image,
        make_engine,
        mm_prompt,
        with_media,
    )

    hf = hf_vl_model("dense", seed=5, **TOP)
    _sharpen(hf)  # media and positions visibly steer the greedy tokens
    hf.eval().save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    monkeypatch.setitem(V2_MODELS, "tiny-vl", {**cfg["text_config"], "architectures": ["Qwen3_5ForCausalLM"]})
    monkeypatch.setitem(
        V2_VISION, "tiny-vl", {k: v for k, v in cfg["vision_config"].items() if k != "out_hidden_size"}
    )
    files, ref = build(tmp_path / "hf", tmp_path / "m.ninfer", version, "groupwise", model_id="tiny-vl")
    art = open_artifact(files[0])
    assert art.has_component("vision") and art.not_loaded("vision") is None
    tower = vision_tower(art, EngineConfig())
    assert sum(n.startswith("model.visual.") for n in ref) == len(hf.model.visual.state_dict())
    with torch.no_grad():
        before = {n: t.clone() for n, t in hf.model.visual.state_dict().items()}
        deq = {n: t.bfloat16().float() if n.startswith("model.visual.") else t for n, t in ref.items()}
        _, unexpected = hf.load_state_dict(deq, strict=False)
        assert not unexpected
        assert any(not torch.equal(before[n], t) for n, t in hf.model.visual.state_dict().items())
        grid = torch.tensor([(1, 4, 6), (2, 2, 4)])
        pixels = torch.randn(int(grid.prod(-1).sum()), 1536, generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(
            tower(pixels, grid), hf.model.visual(pixels, grid_thw=grid).pooler_output, atol=1e-4, rtol=0
        )
        p = mm_prompt([*with_media([5, 6, 7], [IDS.image_pad]), 8, 9], [image(64, 96, 0)])
        want = hf.generate(**p.hf_inputs(), max_new_tokens=8, do_sample=False, pad_token_id=0)[
            0, len(p.ids) :
        ]
    engine = make_engine(
        VL(hf, load_model(art.config, art.load_tensors("text"), torch.float32, "cpu"), tower)
    )
    try:
        assert generate(engine, p, 8)[0] == want.tolist()
    finally:
        engine.shutdown()


# ----------------------------------------------------------------------------------------- serving
# the seed's registered sampler presets of the 35B-A3B (its serving doc): thinking and non-thinking
SEED_35B_THINKING = {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
                     "presence_penalty": 1.5, "frequency_penalty": 0.0}  # fmt: skip
SEED_35B_NON_THINKING = {**SEED_35B_THINKING, "temperature": 0.7, "top_p": 0.80}


def _full_vocab(hf_dir: Path, out: Path, vocab: int = 248320) -> Path:
    """A copy of a tiny checkpoint whose embedding and head have the tokenizer's vocabulary (random rows)."""
    from safetensors.torch import load_file, save_file

    out.mkdir()
    for f in hf_dir.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            (out / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["vocab_size"] = vocab
    (out / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    for f in hf_dir.glob("*.safetensors"):
        sd = load_file(f)
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            if name in sd:
                sd[name] = torch.randn(vocab, sd[name].shape[1], generator=g) * 0.1
        save_file(sd, out / f.name)
    return out


def test_a_seed_file_serves_under_its_public_name_with_the_seeds_presets(hf_moe, frontend, tmp_path) -> None:
    """`model.artifact=FILE` (what `ninfer-serve FILE` sets): /v1/models lists the file's
    `metadata.name` with the context it serves, a chat completion for that id answers, and the
    sampler presets are the seed's for its model (the file's generation config has other values)."""
    from openai import OpenAI

    from tests.service.conftest import API_KEY, start_server, stop_server

    hf = _full_vocab(hf_moe, tmp_path / "hf")
    files, _ = build(
        hf,
        tmp_path / "m.ninfer",
        3,
        "moe",
        model_id=MOE_ID,
        formats={"embed": "bf16", "head": "bf16"},
        **frontend,
    )
    overrides = ["engine.device=cpu", f"model.artifact={files[0]}", "engine.max_context=512"]
    srv = start_server(tmp_path, overrides)
    try:
        client = OpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY)
        (card,) = client.models.list().data
        assert card.id == MOE_ID and card.model_extra["max_model_len"] == 512
        out = client.chat.completions.create(
            model=MOE_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert out.model == MOE_ID and out.usage.completion_tokens == 4
        presets = next(e for e in srv.events() if e["event"] == "server_start")["engine"]["sampler_presets"]
        for mode, want in (("thinking", SEED_35B_THINKING), ("non_thinking", SEED_35B_NON_THINKING)):
            assert {k: presets[mode][k] for k in want} == want, mode
    finally:
        assert stop_server(srv) == 0, srv.stderr_path.read_text()[-3000:]


# ----------------------------------------------------------------------------------------- malformed
def _rewrite(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Edit the JSON directory in place, padding with spaces to its length (offsets stay valid)."""
    raw = path.read_bytes()
    hdr = 16 if raw[7] == 2 else 32
    (n,) = struct.unpack_from("<Q", raw, 8)
    doc = json.loads(raw[hdr : hdr + n])
    edit(doc)
    js = json.dumps(doc, separators=(",", ":")).encode()
    assert len(js) <= n
    path.write_bytes(raw[:hdr] + js + b" " * (n - len(js)) + raw[hdr + n :])


@pytest.fixture(scope="module")
def small_files(hf_dir, tmp_path_factory) -> dict[int, list[Path]]:
    """v2 and v3 files with a one-byte tokenizer (malformations need no engine)."""
    root = tmp_path_factory.mktemp("bad")
    return {v: build(hf_dir, root / f"v{v}.ninfer", v, "groupwise", limit=200_000)[0] for v in (2, 3)}


def _copy(files: list[Path], dst: Path) -> list[Path]:
    dst.mkdir()
    for f in files:
        (dst / f.name).write_bytes(f.read_bytes())
    return [dst / f.name for f in files]


def _tensor(doc: dict, i: int = 0) -> dict:
    return [o for o in doc["objects"] if o["kind"] == "tensor"][i]


def _break_v2(rule: str, path: Path) -> None:
    raw = bytearray(path.read_bytes())
    if rule == "magic":
        raw[:8] = b"GGUF\x00\x00\x00\x03"
        path.write_bytes(bytes(raw))
    elif rule == "v1":
        raw[7] = 1
        path.write_bytes(bytes(raw))
    elif rule == "json-past-end":
        raw[8:16] = struct.pack("<Q", len(raw))
        path.write_bytes(bytes(raw))
    elif rule == "truncated":
        path.write_bytes(bytes(raw[: len(raw) - 100]))
    elif rule == "overlap":
        _rewrite(path, lambda d: _tensor(d, 1).update(offset=_tensor(d, 0)["offset"]))
    elif rule == "unaligned":
        _rewrite(path, lambda d: _tensor(d, 1).update(offset=_tensor(d, 1)["offset"] + 8))
    elif rule == "format":
        _rewrite(path, lambda d: _tensor(d, 1).update(format="Q3G64_F16S"))
    elif rule == "bytes":
        _rewrite(path, lambda d: _tensor(d, 1).update(bytes=_tensor(d, 1)["bytes"] - 2))
    elif rule == "extra-member":
        _rewrite(path, lambda d: _tensor(d, 1).update(source="hf"))
    elif rule == "duplicate":
        _rewrite(path, lambda d: _tensor(d, 1).update(name=_tensor(d, 0)["name"]))
    elif rule == "missing-parameter":
        _rewrite(path, lambda d: _tensor(d, 1).update(name="text/layers/0/unused"))


V2_RULES = {
    "magic": "bad magic", "v1": "version 1", "json-past-end": "runs past the end", "truncated": "run past",
    "overlap": "overlaps", "unaligned": "aligned", "format": "unknown format", "bytes": "encoded size",
    "extra-member": "unknown member 'source'", "duplicate": "used by two objects",
    "missing-parameter": "no binding for parameter",
}  # fmt: skip


@pytest.mark.parametrize("rule", sorted(V2_RULES))
def test_a_broken_v2_rule_is_refused_by_name(small_files, tmp_path, rule) -> None:
    (path,) = _copy(small_files[2], tmp_path / "f")
    _break_v2(rule, path)
    with pytest.raises(SeedFormatError, match=V2_RULES[rule]):
        open_artifact(path)


def _break_v3(rule: str, files: list[Path]) -> None:
    entry, last = files[0], files[-1]
    if rule == "truncated-part":
        last.write_bytes(last.read_bytes()[:-1])
    elif rule == "missing-part":
        last.unlink()
    elif rule == "foreign-part":
        raw = bytearray(last.read_bytes())
        raw[16:32] = bytes(16)
        last.write_bytes(bytes(raw))
    elif rule == "part-index":
        raw = bytearray(last.read_bytes())
        raw[8:16] = struct.pack("<Q", 1 if len(files) > 2 else 7)
        last.write_bytes(bytes(raw))
    elif rule == "binding-object":
        _rewrite(entry, lambda d: d["bindings"].update({"text/final_norm": {"object": "nowhere"}}))
    elif rule == "binding-range":

        def far(d: dict) -> None:
            d["bindings"]["text/layers/3/attention/key"]["parts"][0]["range"][1] = 10**9

        _rewrite(entry, far)
    elif rule == "use":
        _rewrite(entry, lambda d: d["uses"].append({"parameter": "text/none", "input": "x"}))
    elif rule == "root-member":
        _rewrite(entry, lambda d: d.update(extensions={}))
    elif rule == "resource-ref":
        _rewrite(
            entry,
            lambda d: d["components"]["text"]["resources"].update({"tokenizer.json": "text/final_norm"}),
        )


V3_RULES = {
    "truncated-part": "truncated part", "missing-part": "missing", "foreign-part": "another artifact",
    "part-index": "part index", "binding-object": "not a tensor object", "binding-range": "not inside",
    "use": "has no binding", "root-member": "unknown member 'extensions'", "resource-ref": "not a resource object",
}  # fmt: skip


@pytest.mark.parametrize("rule", sorted(V3_RULES))
def test_a_broken_v3_rule_is_refused_by_name(small_files, tmp_path, rule) -> None:
    files = _copy(small_files[3], tmp_path / "f")
    assert len(files) > 1
    _break_v3(rule, files)
    with pytest.raises(SeedFormatError, match=V3_RULES[rule]):
        open_artifact(files[0])


def test_inspect_and_serve_exit_2_on_a_broken_file(small_files, tmp_path) -> None:
    (path,) = _copy(small_files[2], tmp_path / "f")
    _break_v2("overlap", path)
    assert artifact_main(["inspect", str(path)]) == 2
    serve = Path(sys.executable).with_name("ninfer-serve")
    run = subprocess.run([str(serve), str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "overlaps" in run.stderr and "object" in run.stderr


@pytest.mark.parametrize("version", [2, 3])
def test_the_indexed_proposal_head_of_a_seed_file_is_the_draft_head(
    hf_dir, frontend, tmp_path, version
) -> None:
    """The file's indexed proposal head (rows of the output head for ids in the file's order) loads
    as our `lm_head_draft` in its stored Q4: its ids, sorted, and its rows equal the writer's; MTP
    speculation with it on the seed file gives the greedy tokens of speculation off."""
    from types import SimpleNamespace

    from ninfer.bootstrap import load_spec_weights, spec_fields
    from ninfer.formats import QuantWeight
    from ninfer.model.weights import load_model
    from tests.speculative.helpers import assert_speculation_exact

    files, ref = build(
        hf_dir, tmp_path / "p.ninfer", version, "groupwise", model_id=MODEL_ID, limit=PART_LIMIT, proposal=96,
        **frontend,
    )  # fmt: skip
    art = open_artifact(files[0])
    assert art.has_component("lm_head_draft") and art.not_loaded("lm_head_draft") is None
    spec = SimpleNamespace(method="mtp", draft_tokens=3, lm_head_draft=True)
    spec_model = load_model(art.config, art.load_tensors("text"), torch.float32, "cpu")
    head = load_spec_weights(spec, art, spec_model, torch.float32, "cpu").draft_head
    assert head is not None
    ids = ref["lm_head_draft.token_ids"].long()
    order = ids.argsort()
    assert not torch.equal(order, torch.arange(len(ids)))  # the file's order is not ascending
    assert torch.equal(head.token_ids, ids[order])
    assert isinstance(head.weight, QuantWeight)  # the stored Q4 rows, not a dense copy
    assert torch.equal(head.weight.dequantize(), ref["lm_head_draft.weight"][order])
    assert artifact_main(["import", str(files[0]), str(tmp_path / "ours")]) == 0  # our component's form
    ours = open_artifact(tmp_path / "ours", verify=True).load_tensors("lm_head_draft")
    assert ours["token_ids"].dtype == torch.int64 and torch.equal(ours["token_ids"], ids[order])
    assert isinstance(ours["weight"], QuantWeight)
    assert torch.equal(ours["weight"].dequantize(), ref["lm_head_draft.weight"][order])
    plain = load_model(art.config, art.load_tensors("text"), torch.float32, "cpu")
    assert_speculation_exact(plain, spec_model, head, **spec_fields(spec))


def test_a_declared_proposal_must_match_its_bindings(tmp_path, hf_dir, frontend) -> None:
    files, _ = build(
        hf_dir, tmp_path / "d.ninfer", 3, "groupwise", model_id=MODEL_ID, proposal=32, **frontend
    )
    _rewrite(
        files[0], lambda d: d["components"]["text"].update({"proposal": {"domain": "indexed", "rows": 31}})
    )
    with pytest.raises(SeedFormatError, match="declares an indexed proposal of 31 rows"):
        open_artifact(files[0])


def test_a_full_proposal_head_flag_on_a_seed_file_is_refused_before_anything_loads(
    small_files, tmp_path
) -> None:
    """The file's proposal head is its full output head (no id map): there is no reduced head, and
    `--lm-head-draft` fails the artifact settings check (the one the server and `ninfer` run before
    binding a port or loading a weight: exit 2, this line) naming it as not loaded rather than absent."""
    from ninfer.config import ConfigError, check_artifact_settings, load_settings

    files = _copy(small_files[3], tmp_path / "f")
    _rewrite(files[0], lambda d: d["bindings"].update({"proposal/head": {"object": "text/output_head"}}))
    art = open_artifact(files[0])
    assert (
        art.not_loaded("dflash") is None
        and open_artifact(small_files[3][0]).not_loaded("lm_head_draft") is None
    )
    with pytest.raises(ConfigError) as info:
        check_artifact_settings(load_settings(["spec.method=mtp", "spec.lm_head_draft=true"]), art)
    assert str(info.value) == (
        "spec.lm_head_draft=true: the full-vocabulary proposal head (no reduced head) of a seed .ninfer "
        "file is not loaded "
        "(the text model and MTP head are): drop --lm-head-draft"
    )
