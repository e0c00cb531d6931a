"""The demo artifact: deterministic, fast, transformers-shaped, cached; weights load by mmap without a copy."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ninfer.artifact import demo, open_artifact
from ninfer.templates import read_template


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """The demo built through the cache entry point (seed 0), with its build time."""
    cache = tmp_path_factory.mktemp("cache")
    start = time.perf_counter()
    path = demo.ensure_demo_artifact(cache)
    return path, time.perf_counter() - start


def test_demo_is_cached(built: tuple[Path, float], monkeypatch: pytest.MonkeyPatch) -> None:
    path, seconds = built
    assert seconds < 60
    assert path.name.startswith("demo-") and path.suffix == ".ninfer"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary directories left behind

    def fail(*a: object, **k: object) -> None:
        raise AssertionError("rebuilt although cached")

    monkeypatch.setattr(demo, "build_demo", fail)
    assert demo.ensure_demo_artifact(path.parent) == path
    monkeypatch.setenv("NINFER_CACHE_DIR", str(path.parent))
    assert demo.ensure_demo_artifact() == path


def test_demo_is_deterministic(built: tuple[Path, float], tmp_path: Path) -> None:
    first = open_artifact(built[0]).manifest.digests
    again = demo.build_demo(tmp_path / "again.ninfer", seed=0)
    assert open_artifact(again).manifest.digests == first
    other = demo.build_demo(tmp_path / "other.ninfer", seed=1)
    digests = open_artifact(other).manifest.digests
    assert (
        digests["weights/text-00001-of-00001.safetensors"] != first["weights/text-00001-of-00001.safetensors"]
    )
    assert digests["tokenizer/tokenizer.json"] == first["tokenizer/tokenizer.json"]


def test_demo_contents(built: tuple[Path, float]) -> None:
    art = open_artifact(built[0], verify=True)
    c = art.config
    assert art.model_id == "ninfer-demo" and art.family == "qwen3_5"
    assert c.vocab_size == 248320 and c.hidden_size == 256 and c.num_hidden_layers == 8
    assert c.attention_layers == (3, 7) and c.rotary_dim == 16 and sum(c.mrope_section) == 8
    assert (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim) == (4, 8, 32)
    assert c.mtp_num_hidden_layers == 1 and art.has_component("mtp") and not c.is_moe
    assert art.chat_template == read_template("qwen3_6")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(art.tokenizer_path))
    assert tok.encode("<|im_start|>user\nhi<|im_end|>").ids[0] == 248045
    assert art.generation["eos_token_ids"] == [248046, 248044]
    text = art.load_tensors("text")
    assert text["model.layers.0.linear_attn.A_log"].dtype == torch.float32
    assert text["model.embed_tokens.weight"].dtype == torch.bfloat16
    for name, t in {**text, **art.load_tensors("mtp")}.items():  # every tensor randomised, norms included
        assert t.float().std() > 0.01, name
    assert total_bytes(art) < 300e6


def total_bytes(art: object) -> int:
    return sum(art.tensor_bytes(c) for c in art.components)  # type: ignore[attr-defined]


def test_demo_names_and_shapes_are_transformers(built: tuple[Path, float]) -> None:
    """The text component is exactly the state dict of transformers' Qwen3_5ForCausalLM for this config."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    hf = {k: v for k, v in demo.DEMO_HF_CONFIG.items() if k not in ("model_type", "mtp_num_hidden_layers")}
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**hf))
    want = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    assert open_artifact(built[0]).tensor_shapes("text") == want
    assert tuple(model.config.layer_types) == open_artifact(built[0]).config.layer_types


_RSS_PROBE = r"""
import json, sys
from ninfer.artifact import open_artifact

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
art = open_artifact(sys.argv[1])
import torch, safetensors.torch  # imported before the baseline
base = status("VmRSS")
tensors = art.load_tensors("text")
touched = 0
for t in tensors.values():  # read one byte of every page, so the whole payload is resident
    flat = t.reshape(-1).view(torch.uint8)
    touched += int(flat[::4096].sum()) + int(flat[-1])
print(json.dumps({"base": base, "peak": status("VmHWM"), "rss": status("VmRSS"), "bytes": art.tensor_bytes("text")}))
"""


def test_load_tensors_maps_instead_of_copying(built: tuple[Path, float]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(built[0])],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    m = json.loads(out.stdout.strip().splitlines()[-1])
    grown = m["peak"] - m["base"]
    assert m["bytes"] > 100e6
    assert m["rss"] - m["base"] > 0.8 * m["bytes"]  # the probe really made the weights resident
    assert grown <= 1.5 * m["bytes"], (
        f"peak RSS grew by {grown / 1e6:.0f} MB for {m['bytes'] / 1e6:.0f} MB of weights"
    )
