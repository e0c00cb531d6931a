"""Speculative decoding through the engine: greedy outputs equal to spec off for k = 1..5, with and
without the proposal head, alone and batched; the oracle drafter's long accepted runs with stops and
limits inside them; fallback steps; counters; startup rejections and frozen residency."""

from __future__ import annotations

import pytest

from ninfer.engine.types import EngineConfigError
from tests.speculative.helpers import (
    PROMPTS,
    check_counters,
    draft_head,
    engine,
    mtp_model,
    prompt,
    request,
    run_batch,
)


@pytest.fixture(scope="module")
def model():
    return mtp_model(0)


@pytest.fixture(scope="module")
def head(model):
    return draft_head(model)


@pytest.fixture(scope="module")
def baseline(model) -> list[list[int]]:
    eng = engine(model)
    try:
        return [t for t, _, _ in run_batch(eng, [request(p) for p in PROMPTS])]
    finally:
        eng.shutdown(5)


def _spec_run(model, reqs, head=None, **kw):
    eng = engine(model, head, spec_method="mtp", lm_head_draft=head is not None, **kw)
    try:
        return run_batch(eng, reqs)
    finally:
        eng.shutdown(5)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("reduced", [False, True], ids=["full-head", "reduced-head"])
def test_greedy_batch_of_8_equals_spec_off(model, head, baseline, k: int, reduced: bool) -> None:
    out = _spec_run(model, [request(p) for p in PROMPTS], head if reduced else None, draft_tokens=k)
    assert [t for t, _, _ in out] == baseline
    for _, st, last in out:
        assert last.finish_reason == "length"
        check_counters(st, k, "mtp")


@pytest.mark.parametrize("k", [1, 5])
def test_greedy_alone_equals_spec_off(model, head, baseline, k: int) -> None:
    eng = engine(model, head, spec_method="mtp", lm_head_draft=True, draft_tokens=k, max_concurrency=1,
                 kv_capacity=256)  # fmt: skip
    try:
        for p, want in zip(PROMPTS[:4], baseline, strict=False):
            ((got, st, _),) = run_batch(eng, [request(p)])
            assert got == want
            check_counters(st, k, "mtp")
    finally:
        eng.shutdown(5)


@pytest.mark.parametrize(("k", "wrong"), [(2, 0.0), (5, 0.0), (3, 0.4)])
def test_oracle_drafts_are_accepted_and_outputs_unchanged(model, baseline, k: int, wrong: float) -> None:
    out = _spec_run(model, [request(p) for p in PROMPTS], draft_tokens=k, spec_oracle_wrong_fraction=wrong)
    assert [t for t, _, _ in out] == baseline
    drafted = accepted = 0
    for _, st, _ in out:
        c = check_counters(st, k, "oracle")
        drafted, accepted = drafted + c["drafted_tokens"], accepted + c["accepted_tokens"]
    rate = accepted / drafted
    if wrong == 0.0:  # only the last round of each request is cut by max_tokens
        assert rate > 0.8 and all(st.speculative["accepted_per_position"][-1] > 0 for _, st, _ in out)
    else:
        assert 0.15 < rate < 0.8


def test_stop_token_inside_an_accepted_run_then_reuse(model, baseline) -> None:
    """A stop token in the middle of a 5-token accepted run commits exactly the target's prefix; the
    lane then continues (append_frontier) exactly as an engine that never speculated."""
    k = 5
    stops = [b[7] for b in baseline]
    first = [request(p, stop_token_ids=(s,), ignore_eos=False) for p, s in zip(PROMPTS, stops, strict=True)]
    eng = engine(model, spec_method="mtp", draft_tokens=k, spec_oracle_wrong_fraction=0.0)
    ref = engine(model, no_prefix_reuse=True)
    try:
        out = run_batch(eng, first)
        for (got, st, last), want, s in zip(out, baseline, stops, strict=True):
            cut = want.index(s) + 1
            assert got == want[:cut] and last.finish_reason == "stop" and last.stop_token_id == s
            check_counters(st, k, "oracle")
        second = [
            request((*p, *got, *prompt(5, 40 + i)))
            for i, (p, (got, _, _)) in enumerate(zip(PROMPTS, out, strict=True))
        ]
        again = run_batch(eng, second)
        want2 = run_batch(ref, second)
        assert [t for t, _, _ in again] == [t for t, _, _ in want2]
        assert all(st.reuse_path == "append_frontier" for _, st, _ in again)
    finally:
        eng.shutdown(5)
        ref.shutdown(5)


def test_stop_string_and_max_tokens_inside_accepted_runs(model, baseline) -> None:
    k = 5
    p, want = PROMPTS[3], baseline[3]
    stop = f"<{want[5]}><{want[6]}"  # straddles two tokens of one accepted run
    eng = engine(model, detok=True, spec_method="mtp", draft_tokens=k, spec_oracle_wrong_fraction=0.0)
    try:
        (got, st, last), (got2, st2, last2) = run_batch(
            eng, [request(p, stop=(stop,)), request(p, max_tokens=9)]
        )
        assert got == want[:7] and last.finish_reason == "stop" and last.stop_string == stop
        assert got2 == want[:9] and last2.finish_reason == "length"
        c = check_counters(st2, k, "oracle")
        assert c["rounds"] == 2 and c["accepted_tokens"] == 5 + 2  # 1 + (5 + 1) + 2 committed drafts
        check_counters(st, k, "oracle")
    finally:
        eng.shutdown(5)


def test_fallback_steps_near_the_end_of_the_pages(model) -> None:
    """Prompt 60 + 4 tokens fit one 64-token page: no room for k+1 = 6 verify rows, plain steps."""
    p = prompt(60, 77)
    ref = engine(model)
    eng = engine(model, spec_method="mtp", draft_tokens=5)
    try:
        ((want, _, _),) = run_batch(ref, [request(p, max_tokens=4)])
        ((got, st, _),) = run_batch(eng, [request(p, max_tokens=4)])
        assert got == want
        c = check_counters(st, 5, "mtp")
        assert c["fallback_steps"] == 3 and c["rounds"] == 0
    finally:
        ref.shutdown(5)
        eng.shutdown(5)


@pytest.mark.parametrize("oracle", [None, 0.3])
def test_seeded_sampling_is_reproducible(model, head, oracle) -> None:
    reqs = [request(p, temperature=0.9, top_k=40, seed=11 + i) for i, p in enumerate(PROMPTS[:4])]
    kw = {"draft_tokens": 3, "spec_oracle_wrong_fraction": oracle}
    a = _spec_run(model, reqs, head if oracle is None else None, **kw)
    b = _spec_run(model, reqs, head if oracle is None else None, **kw)
    assert [t for t, _, _ in a] == [t for t, _, _ in b]
    for _, st, _ in a:
        check_counters(st, 3, "oracle" if oracle is not None else "mtp")


def test_residency_frozen_and_startup_rejections(model, head) -> None:
    from tests.engine.tiny import tiny_model

    eng = engine(model)
    try:
        assert eng.spec is None and eng.layout.draft_slots == 0 and eng.runner.spec is None
    finally:
        eng.shutdown(5)
    eng = engine(model, spec_method="mtp")
    try:
        assert eng.layout.draft_slots == eng.config.draft_tokens == 3  # one scratch slot per draft position
        assert eng.spec.drafter.kv.num_layers == 1
        assert eng.spec.drafter.kv.num_pages == eng.kv.num_pages
    finally:
        eng.shutdown(5)
    bad = [
        ({"spec_method": "dflash"}, "dflash needs a qwen3_5_moe"),
        ({"spec_method": "mtp", "draft_tokens": 6}, "1..5"),
        ({"spec_method": "mtp", "lm_head_draft": True}, "no 'lm_head_draft'"),
        ({"lm_head_draft": True}, "requires a speculative method"),
    ]
    for kw, msg in bad:
        with pytest.raises(EngineConfigError, match=msg):
            engine(model, **kw)
    with pytest.raises(EngineConfigError, match="no MTP head"):
        engine(tiny_model(512), spec_method="mtp")


@pytest.mark.parametrize("oracle", [None, 0.3])
def test_greedy_with_penalties_equals_spec_off(model, oracle) -> None:
    """Penalties count the draft prefix of each verified position, as sequential decoding would."""
    reqs = [request(p, frequency_penalty=1.5, presence_penalty=0.5) for p in PROMPTS[:4]]
    ref = engine(model)
    try:
        want = [t for t, _, _ in run_batch(ref, reqs)]
    finally:
        ref.shutdown(5)
    out = _spec_run(model, reqs, draft_tokens=4, spec_oracle_wrong_fraction=oracle)
    assert [t for t, _, _ in out] == want
