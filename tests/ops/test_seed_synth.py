"""ops/bench/seed_synth.py on a tiny geometry: the streamed seed v3 file (one file, and split into
continuation parts) opens, `inspect` describes its formats, every matrix carries the groupwise-int
recipe's format (the serving benchmark tags its result `seed-v3-groupwise-int`), and the engine
generates from it on the CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ninfer import LLM, SamplingParams
from ninfer.artifact import open_artifact
from ninfer.artifact.profiles import format_for
from ops.bench import seed_synth, serve


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("seed") / "tiny.ninfer"
    assert seed_synth.main(["--tiny", str(out)]) == 0
    return out


def test_the_file_opens_with_the_seeds_27b_recipe(tiny: Path) -> None:
    art = open_artifact(tiny)
    assert art.manifest.created_by == "seed .ninfer v3"
    assert art.config.num_hidden_layers == 4 and art.config.mtp_num_hidden_layers == 1
    for comp in ("text", "mtp"):
        for name, fmts in art.stored_formats(comp).items():  # type: ignore[attr-defined]
            want = format_for("groupwise-int", art.config, "qwen3.6-27b", name)
            got = art.quantized.get(comp, {}).get(name)
            assert (got.fmt if got else None) == want, (name, fmts)
    assert art.dequantized_on_load() == []  # type: ignore[attr-defined]


def test_inspect_names_the_formats_and_bits(tiny: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "ninfer.artifact", "inspect", str(tiny)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    for fmt in ("q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16", "bits/weight", "container v3"):
        assert fmt in r.stdout, fmt


def test_the_engine_generates_from_it(tiny: Path) -> None:
    llm = LLM(str(tiny))
    assert torch.isfinite(llm.logits([1, 2, 3])).all()
    out = llm.generate(["Hello"], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4


def test_continuation_parts_past_the_limit(tmp_path: Path) -> None:
    out = tmp_path / "split.ninfer"
    assert seed_synth.main(["--tiny", "--layers", "1", "--no-mtp", "--part-limit", "16000000", str(out)]) == 0
    parts = sorted(tmp_path.glob("split.ninfer.part-*"))
    assert len(parts) >= 2 and all(p.stat().st_size <= 16_000_000 for p in [out, *parts])
    art = open_artifact(out)
    assert len(art.sf.parts) == 1 + len(parts)  # type: ignore[attr-defined]
    w = art.load_tensors("text")["model.embed_tokens.weight"]  # straddles the parts
    assert torch.isfinite(w.dequantize()[:8]).all()  # type: ignore[union-attr]


def test_the_serving_result_names_the_container_and_recipe(tiny: Path) -> None:
    assert serve._weights(str(tiny)) == ("seed-v3-groupwise-int", "seed .ninfer v3")
