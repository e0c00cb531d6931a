"""Engine logprobs equal log-softmax of the processed logits (penalties, temperature) of a torch
reference forward over the prompt and the generated tokens; greedy and seeded, batched."""

from __future__ import annotations

import pytest
import torch

from ninfer.engine.types import GenerationRequest, SamplingParams, TokenLogprob
from ninfer.offline import LLM
from tests.engine.tiny import make_engine


def _reference(ref: LLM, prompt: list[int], out: list[int], p: SamplingParams) -> torch.Tensor:
    """[len(out), V] log-softmax of the logits each token was sampled from."""
    logits = ref.logits(prompt + out[:-1])[len(prompt) - 1 :].clone()  # [n, V]
    counts: dict[int, int] = {}
    for i, tok in enumerate(out):
        for t, c in counts.items():
            logits[i, t] -= c * (p.frequency_penalty or 0.0) + (p.presence_penalty or 0.0)
        counts[tok] = counts.get(tok, 0) + 1
    return torch.log_softmax(logits / (p.temperature or 1.0), dim=-1)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=5),
        SamplingParams(max_tokens=10, temperature=0.8, seed=7, ignore_eos=True, logprobs=3),
        SamplingParams(
            max_tokens=10, temperature=1.3, seed=3, presence_penalty=0.5, frequency_penalty=0.3,
            ignore_eos=True, logprobs=20,
        ),
    ],
    ids=["greedy", "seeded", "penalized"],
)  # fmt: skip
def test_logprobs_match_torch_reference(small_model, params: SamplingParams) -> None:
    ref = LLM.from_model(small_model)
    prompts = [[(i * 13 + s) % 500 + 1 for i in range(n)] for s, n in enumerate((9, 40, 21))]
    eng = make_engine(small_model, max_concurrency=4, kv_capacity=1024)
    try:
        handles = [
            eng.submit(eng.reserve(), GenerationRequest(f"r{i}", tuple(p), params))
            for i, p in enumerate(prompts)
        ]
        outs = [list(h) for h in handles]
    finally:
        eng.shutdown(5)
    for prompt, steps in zip(prompts, outs, strict=True):
        tokens = [t for s in steps for t in s.token_ids]
        lps = [lp for s in steps for lp in (s.logprobs or ())]
        assert len(tokens) == params.max_tokens
        check_against_reference(ref, prompt, tokens, lps, params)


def check_against_reference(
    ref: LLM, prompt: list[int], tokens: list[int], lps: list[TokenLogprob], params: SamplingParams
) -> None:
    """One logprob per token, each (and its top alternatives) equal to the reference's: the
    alternatives are distinct tokens whose reference logprobs are the reported values and the
    reference's top-k values (the same tokens, but for the order of near-ties)."""
    assert len(lps) == len(tokens)
    want = _reference(ref, prompt, tokens, params)
    for i, lp in enumerate(lps):
        assert lp.token_id == tokens[i]
        assert lp.logprob == pytest.approx(float(want[i, tokens[i]]), abs=2e-4)
        top_vals = torch.topk(want[i], params.logprobs or 0).values.tolist()
        ids, vals = [t for t, _ in lp.top], [v for _, v in lp.top]
        assert len(set(ids)) == len(ids)
        assert vals == pytest.approx(top_vals, abs=2e-4)
        assert [float(want[i, t]) for t in ids] == pytest.approx(vals, abs=2e-4)
        if params.temperature == 0.0 and lp.top:
            assert lp.top[0][0] == tokens[i]


def test_no_logprobs_unless_asked(small_model) -> None:
    eng = make_engine(small_model, max_concurrency=2, kv_capacity=512)
    try:
        h = eng.submit(eng.reserve(), GenerationRequest("a", (1, 2, 3), SamplingParams(max_tokens=3)))
        assert all(s.logprobs is None for s in h)
    finally:
        eng.shutdown(5)
