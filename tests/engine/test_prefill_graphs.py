"""Short prompt chunks as one replay of a captured one-row graph (padded to a bucket, the state
written only after the last real token): the same tokens as eager prefill, at every place a
short chunk occurs (a whole prompt, the tail after a full chunk, a turn resumed from the cache),
and only buckets the model's graph-safe kernels take."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest

from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.graphs import EagerCapture
from ninfer.engine.plan import PrefillPlan
from ninfer.engine.runner import Runner, prefill_graph_shapes, small_prefill_buckets
from ninfer.engine.types import SamplingParams
from ninfer.model.config import TextConfig
from tests.engine.test_graphs import CPU, _collect, _generate, _submit


def _graphed(
    model, cfg: EngineConfig, buckets: tuple[int, ...], start: bool = True
) -> tuple[Engine, EagerCapture, list[tuple[int, int]]]:
    """An engine whose runner captures with `EagerCapture`; -> (engine, backend, the (rows, q)
    of every prefill replay)."""
    engine = Engine(model, cfg)
    backend = EagerCapture()
    runner = Runner(
        model, engine.kv, engine.states, engine.runner.max_pages, CPU, None,
        max_batch=cfg.max_concurrency, capture=backend, prefill_buckets=buckets,
    )  # fmt: skip
    used: list[tuple[int, int]] = []
    inner = runner._prefill_rows
    runner._prefill_rows = lambda plans, q: (used.append((len(plans), q)), inner(plans, q))[1]  # type: ignore[method-assign]
    engine.runner = runner
    return (engine.start() if start else engine), backend, used


@pytest.mark.parametrize("params", [{"temperature": 0.0}, {"temperature": 1.0, "top_k": 20}])
def test_short_chunks_through_prefill_graphs_equal_eager(small_model, params) -> None:
    cfg = EngineConfig(max_concurrency=6, max_pending=8, max_context=256, prefill_chunk=64, kv_capacity=1536)
    # 5, 20, 33: whole prompts in a bucket; 70 = 64 + 6 and 130 = 64 + 64 + 2: tails after a history
    prompts = [
        tuple((i * 31 + j * 7) % 500 + 1 for j in range(n)) for i, n in enumerate((5, 70, 20, 130, 33))
    ]
    eager = Engine(small_model, replace(cfg, no_cuda_graph=True)).start()
    want = _generate(eager, prompts, **params)
    # a second turn: the first prompt, its answer and 4 more tokens (its lane still resident: resumed)
    follow = [(*prompts[0], *want[0], 11, 12, 13, 14)]
    want_follow = _generate(eager, follow, **params)
    eager.shutdown()
    engine, backend, used = _graphed(small_model, cfg, (16, 32, 48, 64))
    got = [_collect(_submit(engine, [p], i, **params))[0] for i, p in enumerate(prompts)]  # one at a time
    got_follow = _generate(engine, follow, **params)
    engine.shutdown()
    assert {(1, 16), (1, 32), (1, 48), (1, 64)} <= set(backend.captured)
    assert got == want and got_follow == want_follow
    # 5, 6, 2 and the second turn's 4 -> 16; 20 -> 32; 33 -> 48; the full 64-token chunks -> 64
    assert sorted(q for _, q in used) == [16, 16, 16, 16, 32, 48, 64, 64, 64]
    assert all(b == 1 for b, _ in used)
    assert engine.runner.graph_stats is not None
    assert engine.runner.graph_stats.prefill_buckets == (16, 32, 48, 64)


@pytest.mark.parametrize("params", [{"temperature": 0.0}, {"temperature": 1.0, "top_k": 20}])
def test_prompts_arriving_together_share_one_prefill_replay(small_model, params) -> None:
    """Requests admitted together prefill their short chunks in one (B, q) replay (each row padded
    to the widest chunk's bucket) and produce the tokens of eager prefill."""
    cfg = EngineConfig(max_concurrency=6, max_pending=8, max_context=256, prefill_chunk=64, kv_capacity=1536)
    prompts = [
        tuple((i * 31 + j * 7) % 500 + 1 for j in range(n)) for i, n in enumerate((5, 70, 20, 130, 33, 9))
    ]
    eager = Engine(small_model, replace(cfg, no_cuda_graph=True)).start()
    want = _generate(eager, prompts, **params)
    eager.shutdown()
    engine, backend, used = _graphed(small_model, cfg, (16, 32, 48, 64), start=False)
    handles = _submit(engine, prompts, **params)  # queued before the engine runs: admitted together
    engine.start()
    got = _collect(handles)
    engine.shutdown()
    assert got == want
    # the first chunks of all six (5, 64, 20, 64, 33, 9 tokens) in one replay padded to 64; then
    # the second chunks of the 70- and 130-token prompts (6 and 64 tokens), then the 130's last 2
    assert used == [(6, 64), (2, 64), (1, 16)]
    assert (6, 64) in backend.captured and engine.runner.graph_stats is not None
    assert (6, 64) in engine.runner.graph_stats.prefill_shapes


def test_a_chunk_whose_padding_has_no_pages_runs_eagerly(small_model) -> None:
    """The padding's K/V must land in the sequence's own pages: a chunk whose bucket reaches past
    them takes the eager path."""
    cfg = EngineConfig(max_concurrency=1, max_pending=2, max_context=256, prefill_chunk=64)
    engine, _, used = _graphed(small_model, cfg, (16, 32))
    engine.shutdown()
    runner = engine.runner
    one_page = [0]
    assert runner._bucket(PrefillPlan(seq_id=1, tokens=[1] * 20, cached=0, slot=0, pages=one_page)) == 32
    assert runner._bucket(PrefillPlan(seq_id=1, tokens=[1] * 20, cached=40, slot=0, pages=one_page)) is None
    assert runner._bucket(PrefillPlan(seq_id=1, tokens=[1] * 20, cached=40, slot=0, pages=[0, 1])) == 32
    assert runner._bucket(PrefillPlan(seq_id=1, tokens=[1] * 33, cached=0, slot=0, pages=[0, 1])) is None
    # warm-up asks for the eager forward where a bucket fits (it compiles that path before ready)
    assert (
        runner._bucket(PrefillPlan(seq_id=1, tokens=[1] * 20, cached=0, slot=0, pages=[0], cuda_graph=False))
        is None
    )
    assert used == []


DENSE = TextConfig(
    family="qwen3_5", vocab_size=64, hidden_size=8, num_hidden_layers=1, layer_types=("full_attention",),
    num_attention_heads=1, num_key_value_heads=1, head_dim=8, linear_num_key_heads=1,
    linear_num_value_heads=1, linear_key_head_dim=8, linear_value_head_dim=8, intermediate_size=8,
    mrope_section=(1, 1, 0), eos_token_ids=(1,),
)  # fmt: skip


def test_moe_buckets_stay_within_the_small_kernels() -> None:
    dense = DENSE
    moe = replace(dense, family="qwen3_5_moe", num_experts=256, num_experts_per_tok=8, intermediate_size=None,
                  moe_intermediate_size=8, shared_expert_intermediate_size=8)  # fmt: skip
    assert small_prefill_buckets((16, 32, 48, 64, 128, 1), dense) == (16, 32, 48, 64)
    assert small_prefill_buckets((16, 32, 48, 64), moe) == (16, 32, 48)  # 64 x 8 routed rows > 384
    # several rows: at most 64 tokens and 384 routed rows a replay
    assert prefill_graph_shapes((16, 32, 48), moe, 8) == ((1, 16), (2, 16), (1, 32), (1, 48))


def test_prefill_graph_shapes_and_grouping() -> None:
    """Rows 1, 2, 4, ... and the largest; the scheduler groups as many fitting chunks as one
    captured graph takes, in admission order, skipping chunks no graph takes."""
    from ninfer.engine.scheduler import Scheduler

    dense = DENSE
    assert prefill_graph_shapes((16, 64), dense, 6) == tuple((b, q) for q in (16, 64) for b in (1, 2, 4, 6))
    captured = {1, 2, 4}

    def fit(chunks: list[tuple[int, int, int]]) -> int | None:
        return 16 if len(chunks) in captured and all(t <= 16 for t, _, _ in chunks) else None

    sched = Scheduler.__new__(Scheduler)  # the grouping alone: chunks stand in for requests
    sched.prefill_fit = fit

    @dataclass
    class FakeRequest:
        n: int  # the next chunk's tokens
        submitted: SimpleNamespace = field(
            default_factory=lambda: SimpleNamespace(multimodal=None, params=SamplingParams())
        )

    seqs = [FakeRequest(n) for n in (5, 40, 9, 12, 3)]  # the 40-token chunk fits no graph
    sched._chunk_shape = lambda s: (s.n, 0, 4)  # type: ignore[method-assign]
    group, q = sched._prefill_group(seqs)  # type: ignore[arg-type]
    assert q == 16 and [s.n for s in group] == [5, 9, 12, 3]  # 4 rows: a captured count
    group, q = sched._prefill_group(seqs[:4])  # type: ignore[arg-type]
    assert q == 16 and [s.n for s in group] == [5, 9]  # 3 fitting, no 3-row graph: 2
    group, q = sched._prefill_group([seqs[1], seqs[0]])  # type: ignore[arg-type]
    assert q is None and group == [seqs[1]]  # the first fits nothing: it goes alone


def test_a_failed_capture_of_several_rows_keeps_the_one_row_prefill_graphs(small_model, monkeypatch) -> None:
    from ninfer.engine.graphs import StepGraphs

    inner = StepGraphs._capture_one

    def capture_one(self, b: int, q: int, pool: object) -> None:
        if b > 1 and q > 1:
            raise RuntimeError("out of memory (planted)")
        inner(self, b, q, pool)

    monkeypatch.setattr(StepGraphs, "_capture_one", capture_one)
    cfg = EngineConfig(max_concurrency=4, max_pending=8, max_context=256, prefill_chunk=64)
    engine, _, _ = _graphed(small_model, cfg, (16, 32))
    engine.shutdown()
    stats = engine.runner.graph_stats
    assert stats is not None and stats.batch_sizes == (1, 2, 3, 4)  # decode graphs untouched
    assert stats.prefill_shapes == ((1, 16), (1, 32)) and stats.prefill_buckets == (16, 32)
    assert stats.prefill_error is not None and "planted" in stats.prefill_error
