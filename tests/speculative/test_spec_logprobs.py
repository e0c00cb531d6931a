"""Logprobs with speculative decoding: every committed token of a round (accepted drafts and the
target's own token) reports what the plain path would. Greedy: tokens and logprobs (top
alternatives included) equal to spec off; seeded sampling: equal to the log-softmax of the
processed logits of an independent torch forward over the same prefix."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.engine.types import RequestStats, TokenLogprob
from ninfer.offline import LLM
from tests.engine.test_logprobs import check_against_reference
from tests.speculative.helpers import (
    PROMPTS,
    assert_same_logprobs,
    engine,
    mtp_model,
    prompt,
    request,
    run_logprobs,
)

# the oracle drafts the target's own choices (some replaced by wrong ones): long accepted runs
SPECS: dict[str, dict[str, Any]] = {
    "mtp": {"spec_method": "mtp", "draft_tokens": 3},
    "oracle": {"spec_method": "mtp", "draft_tokens": 4, "spec_oracle_wrong_fraction": 0.3},
}
# (prompt, max_tokens): a 60-token prompt with 4 tokens fits one page, which leaves no room for k+1
# verify rows near its end: plain steps inside the rounds
REQ_PROMPTS = [*((p, 24) for p in PROMPTS), (prompt(60, 77), 24), (prompt(60, 78), 4)]
Outputs = list[tuple[list[int], list[TokenLogprob], RequestStats]]


@pytest.fixture(scope="module")
def model():
    return mtp_model(0)


def _generate(model: Any, params: dict[str, Any], **kw: Any) -> Outputs:
    eng = engine(model, **kw)
    try:
        return run_logprobs(eng, [request(p, n, **params) for p, n in REQ_PROMPTS])
    finally:
        eng.shutdown(5)


def _accepted(out: Outputs) -> int:
    return sum(st.speculative["accepted_tokens"] for _, _, st in out)


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize(
    "params",
    [{"logprobs": 5}, {"logprobs": 20, "frequency_penalty": 1.5, "presence_penalty": 0.5}],
    ids=["greedy", "penalized"],
)
def test_greedy_logprobs_equal_spec_off(model, spec: str, params: dict[str, Any]) -> None:
    want = _generate(model, params)
    got = _generate(model, params, **SPECS[spec])
    assert _accepted(got) > 0  # committed drafts report logprobs too
    assert got[-1][2].speculative["fallback_steps"] > 0  # and plain steps inside a round
    for (wt, wl, _), (gt, gl, _) in zip(want, got, strict=True):
        assert gt == wt and len(wl) == len(wt)
        assert_same_logprobs(gl, wl)


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.8, "top_k": 40, "logprobs": 3},
        {"temperature": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3, "logprobs": 20},
        {"temperature": 0.0, "frequency_penalty": 1.5, "logprobs": 0},
    ],
    ids=["seeded", "seeded-penalized", "greedy-penalized"],
)
def test_logprobs_match_torch_reference(model, spec: str, params: dict[str, Any]) -> None:
    ref = LLM.from_model(model)
    out = _generate(model, {**params, "seed": 5}, **SPECS[spec])
    assert _accepted(out) > 0
    for (p, _), (tokens, lps, _) in zip(REQ_PROMPTS, out, strict=True):
        check_against_reference(ref, list(p), tokens, lps, request(p, **params).params)
