"""Thinking budgets with a grammar and MTP speculation (the grammar tests' tiny tokenizer, model and
compiler): the reasoning ends within its budget with the close written by the engine, the JSON
answer after `</think>` validates, and speculative greedy tokens (drafts right, and half of them
wrong) equal spec off."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from ninfer.engine.types import GenerationRequest, SamplingParams
from tests.speculative import test_spec_grammar as sg
from tests.speculative.helpers import run_batch
from tests.speculative.test_spec_grammar import JSON_SPEC, PROMPTS, SCHEMA, THINK_END, _engine

tokenizer, grammars, model = sg.tokenizer, sg.grammars, sg.model  # the grammar tests' fixtures

BUDGETS = [2, 5, 9]


def _requests() -> list[GenerationRequest]:
    params = [SamplingParams(max_tokens=64, temperature=0.0, thinking_budget=b) for b in BUDGETS]
    reqs = [GenerationRequest("g", PROMPTS[i], p, constraint=JSON_SPEC) for i, p in enumerate(params)]
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, thinking_budget=4)
    return [*reqs, GenerationRequest("f", PROMPTS[3], free)]


def _close(tokenizer: Any) -> dict[str, Any]:
    return {"think_close": tuple(tokenizer[0].encode("\n</think>\n\n").ids), "think_end_id": THINK_END}


@pytest.mark.parametrize("wrong", [None, 0.5])
def test_budget_grammar_and_mtp(model, grammars, tokenizer, wrong: float | None) -> None:
    close = _close(tokenizer)
    base = _engine(model, grammars, **close)
    try:
        want = [t for t, _, _ in run_batch(base, _requests())]
    finally:
        base.shutdown(5)
    kw: dict[str, Any] = {"spec_method": "mtp", "draft_tokens": 3}
    if wrong is not None:
        kw["spec_oracle_wrong_fraction"] = wrong
    spec = _engine(model, grammars, **close, **kw)
    try:
        out = run_batch(spec, _requests())
    finally:
        spec.shutdown(5)
    assert [t for t, _, _ in out] == want
    for tokens, budget in zip(want, [*BUDGETS, 4], strict=True):
        end = tokens.index(THINK_END)
        assert end + 1 <= budget, (budget, tokens)
        if end + 1 == budget and budget > 1:
            assert tokens[end - 1] == close["think_close"][0]  # the close the engine wrote
    for tokens in want[: len(BUDGETS)]:  # the grammar starts right after </think>
        answer = tokenizer[0].decode(tokens[tokens.index(THINK_END) + 1 :], skip_special_tokens=True)
        jsonschema.validate(json.loads(answer), SCHEMA)
