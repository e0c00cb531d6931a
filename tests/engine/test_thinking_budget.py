"""Thinking budgets in the engine: a thinking request reasons at most `budget` tokens, then the
template's close ("\\n</think>\\n\\n", here ids 10 11 12) is written and the answer follows; the same
tokens with MTP speculation (drafts verified under the budget's masks, right and wrong drafts) as
without; sampled rows keep the bound; a grammar inside sees every token and starts after `</think>`."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ninfer.engine.thinking_budget import ThinkClose, ThinkingBudget
from ninfer.engine.types import GenerationRequest, SamplingParams
from tests.speculative.helpers import PROMPTS, engine, mtp_model, run_batch

CLOSE = {"think_close": (10, 11, 12), "think_end_id": 11}
END = 11


@pytest.fixture(scope="module")
def model() -> Any:
    return mtp_model(seed=4)


def _requests(budgets: list[int | None], thinking: bool = True, **params: Any) -> list[GenerationRequest]:
    fields = {"max_tokens": 20, "temperature": 0.0, "ignore_eos": True, **params}
    return [
        GenerationRequest(f"r{i}", PROMPTS[i], SamplingParams(thinking_budget=b, **fields), thinking=thinking)
        for i, b in enumerate(budgets)
    ]


def _check(tokens: list[int], budget: int) -> None:
    """At most `budget` reasoning tokens, the first `</think>` included; a forced close is whole."""
    assert END in tokens, tokens
    end = tokens.index(END)
    assert end + 1 <= budget, (budget, tokens)
    if end + 1 == budget:  # the budget ran out (or the model closed exactly there): the close
        assert budget == 1 or tokens[end - 1] == 10
        assert tokens[end + 1] == 12


BUDGETS = [1, 2, 3, 6, None, 4]


def test_budget_closes_the_reasoning(model) -> None:
    eng = engine(model, **CLOSE)
    try:
        out = run_batch(eng, _requests(BUDGETS))
        free = run_batch(eng, _requests([4], thinking=False))  # no thinking: no budget applies
    finally:
        eng.shutdown(5)
    for (tokens, stats, _), budget in zip(out, BUDGETS, strict=True):
        assert len(tokens) == 20 and stats.completion_tokens == 20
        if budget is not None:
            _check(tokens, budget)
    assert out[0][0][:2] == [END, 12]  # budget 1: the close at once, without the newline
    plain = engine(model)  # without budgets: the same tokens where no budget applied
    try:
        unlimited = run_batch(plain, [*_requests(BUDGETS[:5])[4:], *_requests([None], thinking=False)])
    finally:
        plain.shutdown(5)
    assert out[4][0] == unlimited[0][0]
    assert free[0][0] == unlimited[1][0]


@pytest.mark.parametrize("wrong", [None, 0.4])
def test_speculative_tokens_equal_spec_off(model, wrong: float | None) -> None:
    base = engine(model, **CLOSE)
    try:
        want = [t for t, _, _ in run_batch(base, _requests(BUDGETS))]
    finally:
        base.shutdown(5)
    kw: dict[str, Any] = {"spec_method": "mtp", "draft_tokens": 3}
    if wrong is not None:
        kw["spec_oracle_wrong_fraction"] = wrong
    spec = engine(model, **CLOSE, **kw)
    try:
        out = run_batch(spec, _requests(BUDGETS))
    finally:
        spec.shutdown(5)
    assert [t for t, _, _ in out] == want
    assert sum(st.speculative["accepted_tokens"] for _, st, _ in out) > 0


def test_sampled_rows_keep_the_bound(model) -> None:
    budgets = [2, 5, 7, 3]
    spec = engine(model, **CLOSE, spec_method="mtp", draft_tokens=2)
    try:
        out = run_batch(spec, _requests(budgets, temperature=1.0, seed=11))
    finally:
        spec.shutdown(5)
    for (tokens, _, _), budget in zip(out, budgets, strict=True):
        _check(tokens, budget)


def test_budget_refused_without_close_tokens(model) -> None:
    eng = engine(model)
    try:
        with pytest.raises(ValueError, match="thinking budget needs an engine with a tokenizer"):
            eng.submit(eng.reserve(), _requests([3])[0])
    finally:
        eng.shutdown(5)


class Inner:
    """A grammar stand-in: free while reasoning, then only token 7; records what it saw."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.answer = False
        self.ahead: list[int] = []

    def fill(self, words: torch.Tensor) -> bool:
        if not self.answer:
            return False
        words.zero_()
        words[0] = 1 << 7
        return True

    def accept(self, token: int) -> None:
        self.seen.append(token)
        self.answer = self.answer or token == END

    def advance(self, token: int) -> bool:
        if self.answer and token != 7:
            return False
        self.ahead.append(token)
        return True

    def rewind(self) -> None:
        self.ahead.clear()


def _allowed(con: ThinkingBudget) -> list[int] | None:
    words = torch.zeros(1, dtype=torch.int32)
    if not con.fill(words):
        return None
    return [t for t in range(32) if (int(words[0]) >> t) & 1]


def test_grammar_inside_starts_after_the_close() -> None:
    inner = Inner()
    con = ThinkingBudget(3, ThinkClose.split((10, 11, 12), END), inner)
    assert _allowed(con) is None
    con.accept(3)
    assert _allowed(con) == [10]  # two reasoning tokens left: the newline, then </think>
    assert con.advance(10) and _allowed(con) == [END]
    assert not con.advance(5)  # a draft off the close is refused, the state unchanged
    con.rewind()
    assert _allowed(con) == [10] and inner.ahead == []
    con.accept(10)
    con.accept(END)
    assert not con.in_reasoning and con.forced == 2
    assert _allowed(con) == [7]  # the grammar at once: the close's trailing "\n\n" is not forced
    assert inner.seen == [3, 10, END]
    with pytest.raises(ValueError, match="once"):
        ThinkClose.split((10, 12), END)


def test_server_default_budget(model) -> None:
    """`--default-thinking-budget`: the flag sets the settings key, the composition root carries it
    into the engine config, and a request without a budget of its own gets it."""
    from ninfer.bootstrap import engine_config
    from ninfer.config import load_settings

    settings = load_settings(["sampling.default_thinking_budget=3"])
    assert engine_config(settings, None, "cpu", "float32").default_thinking_budget == 3
    assert load_settings().sampling.default_thinking_budget is None
    eng = engine(model, **CLOSE, default_thinking_budget=3)
    try:
        (tokens, _, _), (own, _, _) = run_batch(eng, _requests([None, 6]))
    finally:
        eng.shutdown(5)
    _check(tokens, 3)
    _check(own, 6)
