"""End to end: transformers checkpoint -> `.ninfer` artifact -> `LLM`, logits and greedy tokens vs transformers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from hf_fixtures import make_hf_checkpoint

from ninfer import LLM, SamplingParams
from ninfer.artifact.convert import convert


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_artifact_llm_matches_transformers(tmp_path: Path, kind: str) -> None:
    hf_dir = make_hf_checkpoint(tmp_path / "hf", kind, seed=3, with_mtp=True)
    art = convert(hf_dir, tmp_path / "model.ninfer")
    llm = LLM(art)
    assert llm.model.mtp_available
    hf = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, experts_implementation="eager"
    ).eval()
    vocab = hf.config.vocab_size
    prompt = torch.randint(0, vocab, (90,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
        ref_gen = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, pad_token_id=0)
    logits = llm.logits(prompt)
    assert ((logits - ref).abs().max() / ref.abs().max()) <= 1e-4
    out = llm.generate([prompt], SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))[0]
    assert list(out.token_ids) == ref_gen[0, len(prompt) :].tolist()
