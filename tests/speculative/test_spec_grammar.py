"""Speculative decoding of grammar-constrained requests: greedy outputs equal spec off token for
token (MTP k = 1..3, the oracle drafter with every draft right and with wrong drafts the grammar
refuses; DFlash k = 3), thinking on and off, for a JSON schema and a forced tool call, constrained and free rows
in one batch; the answers validate; seeded sampling with speculation stays inside the grammar; the
verification masks are exactly the masks the plain path applies after the drafts are committed;
greedy logprobs with speculation equal spec off; with the MTP proposal graph, constrained rows are
drafted under their masks (every draft admissible) while free rows replay the graph."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ninfer.api.tool_control import ToolControl, answer_constraint
from ninfer.engine import engine as engine_module
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.grammar import Grammars
from ninfer.engine.graphs import EagerCapture
from ninfer.engine.sampler import RowSampler, SamplingOverrides, resolve_sampling, run_masked
from ninfer.engine.types import ConstraintSpec, GenerationRequest, SamplingParams
from ninfer.frontend.conversation import Tool
from ninfer.frontend.parser import parse_text
from tests.speculative.helpers import VOCAB, assert_same_logprobs, mtp_model, prompt, run_batch, run_logprobs

THINK_END, STOPS = 509, (510, 511)  # the tiny model's stop ids are its last two
SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"enum": ["x", "yz"]},
        "c": {"type": "boolean"},
    },
    "required": ["a", "b", "c"],
    "additionalProperties": False,
}
TOOL = Tool(
    "f",
    None,
    {
        "type": "object",
        "properties": {"c": {"enum": ["x", "y"]}},
        "required": ["c"],
        "additionalProperties": False,
    },
)
JSON_SPEC = ConstraintSpec("json_schema", json.dumps(SCHEMA), param="response_format")
TOOL_SPEC = answer_constraint([TOOL], ToolControl(mode="required", parallel=False), None)
CASES = [(JSON_SPEC, False), (JSON_SPEC, True), (TOOL_SPEC, False), (TOOL_SPEC, True)]
PROMPTS = [prompt(9 + 7 * i, 30 + i) for i in range(len(CASES) + 1)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, Path]:
    """A 512-entry byte-level BPE over JSON, tool-call markup and random text (ids 0..507), then
    `<think>`, `</think>` and the two stop tokens: the tiny model's vocabulary."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    corpus = [
        '{"a": 12, "b": "yz", "c": true}',
        "<tool_call>\n<function=f>\n<parameter=c>\nx\n</parameter>\n</function>\n</tool_call>",
    ] * 100
    corpus += [
        "".join(rng.choice('abcdefghijklmnopqrstuvwxyz0123456789 {}:,"') for _ in range(200))
        for _ in range(100)
    ]
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=508, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        ),
    )
    tok.add_special_tokens(["<think>", "</think>", "<|endoftext|>", "<|im_end|>"])
    assert tok.get_vocab_size() == VOCAB and tok.token_to_id("</think>") == THINK_END
    path = tmp_path_factory.mktemp("grammar_tok") / "tokenizer.json"
    tok.save(str(path))
    return tok, path


@pytest.fixture(scope="module")
def grammars(tokenizer) -> Grammars:
    return Grammars(tokenizer[1], VOCAB, STOPS)


@pytest.fixture(scope="module")
def model():
    return mtp_model(0)


def _engine(model: Any, grammars: Grammars, dflash: Any = None, **kw: Any) -> Engine:
    base = EngineConfig(
        max_concurrency=8, max_pending=16, max_context=256, prefill_chunk=64, kv_capacity=2048
    )
    return Engine(model, replace(base, **kw), None, grammars=grammars, dflash=dflash).start()


def _requests(
    temperature: float = 0.0, seed: int | None = None, logprobs: int | None = None
) -> list[GenerationRequest]:
    """The four constrained cases, then one free request (both share the batch)."""
    reqs = [
        GenerationRequest(
            "r",
            p,
            SamplingParams(
                max_tokens=128 if spec is TOOL_SPEC else 64,
                temperature=temperature,
                seed=seed,
                logprobs=logprobs,
            ),
            thinking=thinking,
            constraint=spec,
        )
        for p, (spec, thinking) in zip(PROMPTS, CASES, strict=False)
    ]
    free = SamplingParams(
        max_tokens=24, temperature=temperature, seed=seed, ignore_eos=True, logprobs=logprobs
    )
    return [*reqs, GenerationRequest("r", PROMPTS[-1], free)]


def _run(
    model: Any, grammars: Grammars, reqs: list[GenerationRequest], collect: Any = run_batch, **kw: Any
) -> list[Any]:
    """`collect(engine, reqs)` (default `run_batch`) on an engine with `kw` set."""
    eng = _engine(model, grammars, **kw)
    try:
        for r in reqs:  # a speculative engine compiles the grammar, as any engine with a tokenizer
            if r.constraint is not None:
                eng.check_constraint(r.constraint)
        return collect(eng, reqs)
    finally:
        eng.shutdown(5)


def _check_answers(tok: Tokenizer, outs: list[Any], reasoning_may_stop: bool = False) -> None:
    """Every constrained answer ended by itself and follows its grammar (`reasoning_may_stop`: the
    reasoning, which is free, may end the request with a stop token before any answer)."""
    for (tokens, _, last), (spec, thinking) in zip(outs, CASES, strict=False):
        assert last.finish_reason == "stop" and tokens[-1] in STOPS, (tokens, last)
        body = tokens[:-1]
        if thinking:
            if reasoning_may_stop and THINK_END not in body:
                continue
            assert body.count(THINK_END) == 1
            body = body[body.index(THINK_END) + 1 :]
        assert THINK_END not in body
        text = tok.decode(body, skip_special_tokens=False)
        if spec is JSON_SPEC:
            jsonschema.validate(json.loads(text), SCHEMA)
        else:
            calls = parse_text(text, thinking=False, tools=[TOOL]).tool_calls
            assert len(calls) == 1 and calls[0].name == TOOL.name, text
            jsonschema.validate(calls[0].arguments, TOOL.parameters)


@pytest.fixture(scope="module")
def baseline(model, grammars, tokenizer) -> list[list[int]]:
    outs = _run(model, grammars, _requests())
    _check_answers(tokenizer[0], outs)
    return [t for t, _, _ in outs]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_mtp_greedy_constrained_equals_spec_off(model, grammars, baseline, k: int) -> None:
    out = _run(model, grammars, _requests(), spec_method="mtp", draft_tokens=k)
    assert [t for t, _, _ in out] == baseline


@pytest.mark.parametrize("k", [2, 3])
def test_mtp_draft_graphs_propose_admissible_drafts(model, grammars, baseline, monkeypatch, k: int) -> None:
    """With the proposal graph (EagerCapture stands in for CUDA graphs on the CPU), constrained rows
    are drafted step by step under their masks: each draft is admitted by the row's grammar after
    the drafts before it, while the free row still replays the graph; output equals spec off."""
    monkeypatch.setattr(engine_module, "default_capture", lambda device: EagerCapture())
    replays: list[int] = []
    drafts: list[list[int]] = []  # the constrained rows' proposals
    refused: list[list[int]] = []

    def collect(eng: Any, reqs: list[GenerationRequest]) -> list[Any]:
        assert eng.wait_ready(120)  # the step graph manager captured the proposal graphs
        drafter = eng.spec.drafter
        assert drafter.graphs is not None
        run, propose = drafter.graphs.run, drafter.propose

        def checked(rows: list[Any], k: int) -> list[Any]:
            out = propose(rows, k)
            for r, p in zip(rows, out, strict=True):
                con = r.sampler.constraint
                if con is None:
                    continue
                drafts.append(p.tokens)
                try:
                    if not all(con.advance(d) for d in p.tokens):
                        refused.append(p.tokens)
                finally:
                    con.rewind()
            return out

        drafter.graphs.run = lambda lanes: replays.append(len(lanes)) or run(lanes)
        drafter.propose = checked
        return run_batch(eng, reqs)

    out = _run(model, grammars, _requests(), collect, spec_method="mtp", draft_tokens=k)
    assert [t for t, _, _ in out] == baseline
    assert drafts and not refused, refused[:5]
    assert replays and max(replays) == 1  # the free row alone: constrained rows never take the graph


@pytest.mark.parametrize(("k", "wrong"), [(3, 0.0), (2, 0.5)])
def test_oracle_greedy_constrained_equals_spec_off(model, grammars, baseline, k: int, wrong: float) -> None:
    """Every draft right: the masked drafts are all accepted. Half of them replaced by random
    tokens: mostly tokens the grammar refuses, which end acceptance at their position."""
    out = _run(
        model, grammars, _requests(), spec_method="mtp", draft_tokens=k, spec_oracle_wrong_fraction=wrong
    )
    assert [t for t, _, _ in out] == baseline
    drafted = sum(st.speculative["drafted_tokens"] for _, st, _ in out[:-1])
    accepted = sum(st.speculative["accepted_tokens"] for _, st, _ in out[:-1])
    if wrong == 0.0:
        assert accepted / drafted > 0.85  # only each request's last round is cut by its stop
    else:
        assert 0.1 < accepted / drafted < 0.7


@pytest.mark.parametrize(("k", "wrong"), [(3, None), (2, 0.5)])
def test_greedy_constrained_logprobs_equal_spec_off(model, grammars, k: int, wrong: float | None) -> None:
    """Each committed token's logprobs come from the masked logits of its position: the same
    entries, alternatives the grammar refuses included, as spec off."""
    reqs = _requests(logprobs=4)
    want = _run(model, grammars, reqs, run_logprobs)
    got = _run(
        model,
        grammars,
        reqs,
        run_logprobs,
        spec_method="mtp",
        draft_tokens=k,
        spec_oracle_wrong_fraction=wrong,
    )
    assert sum(st.speculative["accepted_tokens"] for _, _, st in got) > 0
    for (wt, wl, _), (gt, gl, _) in zip(want, got, strict=True):
        assert gt == wt and len(wl) == len(wt)
        assert_same_logprobs(gl, wl)
    assert any(v == float("-inf") for _, lps, _ in got for lp in lps for _, v in lp.top)


@pytest.mark.parametrize("method", ["mtp", "oracle"])
def test_sampled_constrained_answers_follow_the_grammar(model, grammars, tokenizer, method: str) -> None:
    kw = {"spec_oracle_wrong_fraction": 0.3} if method == "oracle" else {}
    out = _run(model, grammars, _requests(0.9, 7), spec_method="mtp", draft_tokens=2, **kw)
    _check_answers(tokenizer[0], out, reasoning_may_stop=True)
    assert all(st.speculative["rounds"] > 0 for _, st, _ in out)


def test_verification_masks_are_the_plain_paths_masks(grammars, tokenizer) -> None:
    """The mask of each verified position is the one the plain path applies once the drafts before
    it are committed, through the end of thinking forced by the reasoning budget and into the
    grammar; the constraint is left as it was; a refused draft ends the masked run."""
    tok = tokenizer[0]
    answer = tok.encode('{"a": 7, "b": "x", "c": false}').ids
    text = [5, 17, 200, THINK_END, *answer, STOPS[1]]
    params = resolve_sampling(SamplingParams(temperature=0.0, seed=0), None, SamplingOverrides())
    logits = torch.zeros(1, len(text) + 1, VOCAB)
    for start in (0, 2, 3, 6):
        plain = RowSampler(params, constraint=grammars.constraint(JSON_SPEC, True, 6))  # budget 3
        look = RowSampler(params, constraint=grammars.constraint(JSON_SPEC, True, 6))
        for t in text[:start]:
            plain.observe(t)
            look.observe(t)
        drafts = text[start:]
        rows, masked = run_masked(logits[:, : len(drafts) + 1], [look], [drafts])
        assert rows == [0]
        for j, d in enumerate(drafts):
            want = torch.full((len(drafts) + 1, VOCAB), 0.0)
            words = torch.full(((VOCAB + 31) // 32,), -1, dtype=torch.int32)
            if plain.constraint.fill(words):  # type: ignore[union-attr]
                allowed = ((words[:, None] >> torch.arange(32)) & 1).reshape(-1)[:VOCAB].bool()
                want[j] = torch.zeros(VOCAB).masked_fill(~allowed, float("-inf"))
            assert torch.equal(masked[0, j], want[j]), (start, j)
            plain.observe(d)
        after = torch.full(((VOCAB + 31) // 32,), -1, dtype=torch.int32)
        assert look.constraint.fill(after) == (start >= 3)  # type: ignore[union-attr]  # back at `start`
    look = RowSampler(params, constraint=grammars.constraint(JSON_SPEC, False, 64))
    _, masked = run_masked(logits[:, :4], [look], [[answer[0], 3, answer[1]]])  # 3: a refused draft
    assert masked[0, 1, 3] == float("-inf") and torch.equal(masked[0, 2], logits[0, 2])


def test_dflash_constrained_equals_spec_off(grammars, tokenizer) -> None:
    """The DFlash drafter drafts constrained rows position by position under the lookahead masks."""
    from tests.speculative.test_dflash_engine import dflash_drafter, moe_model

    want = _run(moe_model(), grammars, _requests())
    drafter = dflash_drafter()
    got = _run(moe_model(), grammars, _requests(), dflash=drafter, spec_method="dflash", draft_tokens=3)
    assert [t for t, _, _ in got] == [t for t, _, _ in want]
    _check_answers(tokenizer[0], got, reasoning_may_stop=True)  # this model's reasoning draws a stop


def test_grammar_tables_are_built_before_ready_where_the_engine_warms_up(model, tokenizer) -> None:
    """The tokenizer tables (~2 s at full vocabulary) are built in the warm-up, not by the first
    constrained request; an engine that does not warm up builds them lazily."""
    lazy = Grammars(tokenizer[1], VOCAB, STOPS)
    cold = _engine(model, lazy, prefill_warmup=False)
    try:
        assert cold.wait_ready(60) and lazy._compiler is None
    finally:
        cold.shutdown()
    warmed = Grammars(tokenizer[1], VOCAB, STOPS)
    engine = _engine(model, warmed, prefill_warmup=True, max_context=128, kv_capacity=1024)
    try:
        assert engine.wait_ready(120) and warmed._compiler is not None
    finally:
        engine.shutdown()
