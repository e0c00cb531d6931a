"""Prompt logprobs of the engine (prefill chunks of 32 tokens, scored a block at a time) equal
transformers' fp32 log-softmax over the same prompt, on a small random checkpoint converted to an
artifact: every prompt token's logprob and its top alternatives."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from hf_fixtures import make_hf_checkpoint

from ninfer import LLM
from ninfer.artifact.convert import convert
from ninfer.engine.types import GenerationRequest, SamplingParams
from tests.engine.tiny import make_engine

TOP = 4


def test_prompt_logprobs_equal_transformers(tmp_path: Path) -> None:
    hf_dir = make_hf_checkpoint(tmp_path / "hf", "dense", seed=5)
    llm = LLM(convert(hf_dir, tmp_path / "model.ninfer"))
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    prompt = torch.randint(
        0, hf.config.vocab_size, (75,), generator=torch.Generator().manual_seed(2)
    ).tolist()
    with torch.no_grad():
        want = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)  # [n, V]
    eng = make_engine(llm.model, max_concurrency=1, kv_capacity=256, prefill_chunk=32)
    try:
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=TOP)
        first = next(iter(eng.submit(eng.reserve(), GenerationRequest("p", tuple(prompt), params))))
    finally:
        eng.shutdown(5)
    got = first.prompt_logprobs
    assert got is not None and len(got) == len(prompt) and got[0] is None
    for i, lp in enumerate(got[1:], start=1):
        assert lp is not None and lp.token_id == prompt[i]
        assert lp.logprob == pytest.approx(float(want[i - 1, prompt[i]]), abs=1e-4)
        top = torch.topk(want[i - 1], TOP)
        assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert [float(want[i - 1, t]) for t, _ in lp.top] == pytest.approx([v for _, v in lp.top], abs=1e-4)
