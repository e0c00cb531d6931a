"""Decode-graph bookkeeping on the CPU: packed one-copy batches (with per-token write slots), per-size
capture, replay through the static buffers (an eager stand-in for CUDA graphs), fallback on capture
failure, `no_cuda_graph`, the compiled layer steps captured (and their failure's fallback)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.graphs import EagerCapture, InstallCut, StepGraphs
from ninfer.engine.plan import DecodePlan, DecodeRow, PrefillPlan
from ninfer.engine.runner import MOE_GRAPH_SEGMENTS, Runner
from ninfer.engine.sampler import RowSampler, SamplingOverrides, resolve_sampling
from ninfer.engine.step_io import pack, packed_len, unpack
from ninfer.engine.types import GenerationRequest, SamplingParams
from ninfer.model.cache import PAGE_SIZE, KVPool, StatePool, make_batch
from ninfer.model.layer_steps import LayerSteps, compiled_steps
from tests.engine.tiny import tiny_model

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("b", "q", "max_pages", "writes"),
    [
        (1, 1, 1, False),
        (3, 1, 5, False),
        (2, 7, 4, False),
        (5, 1, 8, False),
        (3, 4, 5, True),
        (1, 2, 1, True),
    ],
)
def test_pack_unpack_equals_make_batch(b: int, q: int, max_pages: int, writes: bool) -> None:
    g = torch.Generator().manual_seed(b * 100 + q)
    pages = [torch.randperm(50, generator=g)[: 1 + i % max_pages].tolist() for i in range(b)]
    starts = [len(p) * PAGE_SIZE - q - i % 3 for i, p in enumerate(pages)]
    tokens = torch.randint(0, 1000, (b, q), generator=g).tolist()
    slots = torch.randperm(20, generator=g)[:b].tolist()
    ws = torch.randint(-1, 30, (b, q), generator=g).tolist() if writes else None
    flat = torch.full((packed_len(b, q, max_pages, writes),), 12345, dtype=torch.int64)
    packed = pack(flat, tokens, starts, slots, pages, max_pages, writes=ws)
    got = unpack(packed, b, q, max_pages, max_kv_len=77, writes=writes)
    want = make_batch(tokens, starts, slots, pages, max_pages, write_slots=ws)
    for name in ("input_ids", "positions", "slots", "page_table", "cache_lens"):
        a, w = getattr(got, name), getattr(want, name)
        assert a.dtype == w.dtype and torch.equal(a, w), name
    if writes:
        assert got.write_slots is not None and torch.equal(got.write_slots, want.write_slots)
    else:
        assert got.write_slots is None
    assert got.max_kv_len == 77
    got.validate()
    with pytest.raises(ValueError, match="max_pages"):
        pack(flat, tokens, starts, slots, [[0] * (max_pages + 1)] * b, max_pages)


def _pools(model, pages: int = 16, slots: int = 8) -> tuple[KVPool, StatePool]:
    cfg = model.config
    return KVPool.for_config(cfg, pages, torch.float32, CPU), StatePool.for_config(
        cfg, slots, torch.float32, CPU
    )


def test_graphs_capture_every_size_largest_first_and_replay_through_static_buffers(small_model) -> None:
    kv, st = _pools(small_model)
    seen: list[tuple[int, torch.Tensor]] = []

    def step(batch):
        seen.append((batch.input_ids.shape[0], batch.input_ids.data_ptr()))
        assert batch.max_kv_len is None  # graphs attend over the full static page-table width
        hidden = small_model(batch, kv, st)
        return hidden, small_model.logits(hidden)

    backend = EagerCapture()
    cfg = small_model.config
    graphs = StepGraphs(step, 4, 3, cfg.vocab_size, cfg.hidden_size, torch.float32, CPU, backend)
    stats = graphs.capture()
    assert backend.captured == [(4, 1), (3, 1), (2, 1), (1, 1)] and stats.batch_sizes == (1, 2, 3, 4)
    assert stats.error is None and stats.verify_q is None and stats.verify_batch_sizes == ()
    assert all(graphs.has(b) for b in (1, 2, 3, 4)) and not graphs.has(5)
    # replay: the packed input lands in the static buffer the captured step reads
    tokens, starts, slots, pages = [[5], [9]], [3, 70], [6, 2], [[4], [7, 8]]
    host = pack(torch.empty(packed_len(2, 1, 3), dtype=torch.int64), tokens, starts, slots, pages, 3)
    want_kv, want_st = _pools(small_model)
    for src, dst in ((kv.k, want_kv.k), (kv.v, want_kv.v), (st.conv, want_st.conv), (st.ssm, want_st.ssm)):
        for a, w in zip(src, dst, strict=True):
            w.copy_(a)
    ref = small_model.logits(
        small_model(make_batch(tokens, starts, slots, pages, 3), want_kv, want_st)[:, -1]
    )
    out = graphs.run(host, 2)
    assert torch.equal(graphs.static[(2, 1)], host)
    assert seen[-1] == (2, graphs.static[(2, 1)].data_ptr())
    torch.testing.assert_close(out.logits[:, -1], ref, rtol=1e-5, atol=1e-5)
    assert out.logits.data_ptr() == graphs.outputs[1].logits.data_ptr()
    assert out.argmax is not None and torch.equal(out.argmax[:, -1], ref.argmax(-1))
    for a, w in zip(st.ssm, want_st.ssm, strict=True):  # the replay wrote the same GDN state
        torch.testing.assert_close(a, w, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="batch sizes"):
        graphs.capture([5])


class _FailingCapture(EagerCapture):
    def capture(
        self, fn: Callable[[], None], pool: object, install_cut: InstallCut | None = None
    ) -> Callable[[], None]:
        if len(self.captured) == 1:
            raise RuntimeError("operation not permitted when stream is capturing")
        return super().capture(fn, pool, install_cut)


def _runner(model, **kw) -> Runner:
    kv, st = _pools(model)
    return Runner(model, kv, st, 4, CPU, None, max_batch=3, **kw)


def _greedy() -> RowSampler:
    return RowSampler(resolve_sampling(SamplingParams(temperature=0.0), None, SamplingOverrides()))


def test_runner_graph_switches_and_fallback(small_model) -> None:
    assert _runner(small_model).capture_graphs() is None  # CPU: nothing is captured by default
    backend = EagerCapture()
    off = _runner(small_model, cuda_graph=False, capture=backend)
    assert off.capture_graphs() is None and off.graphs is None and backend.captured == []
    failing = _runner(small_model, capture=_FailingCapture())
    stats = failing.capture_graphs()
    assert failing.graphs is None and stats is not None and "stream is capturing" in (stats.error or "")
    backend = EagerCapture()
    on = _runner(small_model, capture=backend, graph_segments=MOE_GRAPH_SEGMENTS)
    assert on.capture_graphs().batch_sizes == (1, 2, 3) and on.graphs is not None
    # each captured step is cut into layer groups (graph_segments of them, fewer for a shallow model)
    layers = len(small_model.layers)
    every = -(-layers // MOE_GRAPH_SEGMENTS)
    assert backend.segments == [-(-layers // every)] * 3 and small_model.layer_hook is None
    single = EagerCapture()
    assert _runner(small_model, capture=single).capture_graphs() is not None and single.segments == [1] * 3
    assert on.capture_graphs() is on.graph_stats  # idempotent
    for r in (failing, on):  # a prefill then a decode step run on both (eager fallback / replay)
        r.execute(PrefillPlan(seq_id=1, tokens=[3, 4, 5], cached=0, slot=0, pages=[1], sampler=_greedy()))
        r.execute(DecodePlan([DecodeRow(1, 7, 3, 0, [1], _greedy())]))
    late = _runner(small_model, capture=EagerCapture())
    late._capture_ran = False
    late.execute(PrefillPlan(seq_id=1, tokens=[3], cached=0, slot=0, pages=[1]))
    with pytest.raises(RuntimeError, match="before the first step"):
        late._capture_ran = False
        late.capture_graphs()


def _submit(engine: Engine, prompts: list[tuple[int, ...]], first: int = 0, **params) -> list:
    """Submit without waiting; request i (counting from `first`) is seeded as `_generate` seeds it."""
    return [
        engine.submit(
            engine.reserve(),
            GenerationRequest(
                f"g{i}", p, SamplingParams(max_tokens=12, seed=40 + i, ignore_eos=True, **params)
            ),
        )
        for i, p in enumerate(prompts, start=first)
    ]


def _collect(handles: list) -> list[list[int]]:
    out = []
    for h in handles:
        tokens, _ = h.result(120.0)
        h.close()
        out.append(list(tokens))
    return out


def _generate(engine: Engine, prompts: list[tuple[int, ...]], **params) -> list[list[int]]:
    return _collect(_submit(engine, prompts, **params))


@pytest.mark.parametrize("params", [{"temperature": 0.0}, {"temperature": 1.0, "top_k": 20}])
def test_engine_tokens_with_replayed_graphs_equal_eager(small_model, params) -> None:
    cfg = EngineConfig(max_concurrency=4, max_pending=8, max_context=256, prefill_chunk=64)
    prompts = [tuple((i * 31 + j * 7) % 500 + 1 for j in range(n)) for i, n in enumerate((5, 70, 33, 130, 9))]
    eager = Engine(small_model, replace(cfg, no_cuda_graph=True)).start()
    want = _generate(eager, prompts, **params)
    eager.shutdown()
    engine = Engine(small_model, cfg)
    backend = EagerCapture()
    engine.runner = Runner(
        small_model,
        engine.kv,
        engine.states,
        engine.runner.max_pages,
        CPU,
        None,
        max_batch=4,
        capture=backend,
    )
    engine.start()
    got = _generate(engine, prompts, **params)
    engine.shutdown()
    assert backend.captured == [(4, 1), (3, 1), (2, 1), (1, 1)]
    assert got == want


def test_on_launch_runs_once_after_a_graph_launch_and_before_eager_work(small_model) -> None:
    """Runner.execute's on_launch (the engine delivers the last round's tokens there): right after a
    replayed graph is launched, so the callers' threads run while the GPU works; before an eager
    forward, whose kernel launches are themselves host work; exactly once per step."""
    events: list[str] = []
    graphed = _runner(small_model, capture=EagerCapture())
    graphed.capture_graphs()
    assert graphed.graphs is not None
    inner = graphed.graphs.run
    graphed.graphs.run = lambda host, b, q=1, feed=None: (events.append("replay"), inner(host, b, q, feed))[1]  # type: ignore[method-assign]
    prefill = PrefillPlan(seq_id=1, tokens=[3, 4, 5], cached=0, slot=0, pages=[1], sampler=_greedy())
    graphed.execute(prefill, on_launch=lambda: events.append("launch"))
    assert events == ["launch"]
    events.clear()
    graphed.execute(
        DecodePlan([DecodeRow(1, 7, 3, 0, [1], _greedy())]), on_launch=lambda: events.append("launch")
    )
    assert events == ["replay", "launch"]
    eager = _runner(small_model, cuda_graph=False)
    events.clear()
    eager.execute(prefill, on_launch=lambda: events.append("launch"))
    eager.execute(
        DecodePlan([DecodeRow(1, 7, 3, 0, [1], _greedy())]), on_launch=lambda: events.append("launch")
    )
    assert events == ["launch", "launch"]


def test_a_compiled_step_that_fails_at_capture_falls_back_to_the_eager_step(small_model, monkeypatch) -> None:
    """A compiled layer step failing while the graphs are captured (before ready) leaves the eager
    layers, captured, with the reason in the graph stats; requests never meet the failure."""

    def broken(*args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        raise RuntimeError("InductorError: SubprocException (planted)")

    monkeypatch.setattr("ninfer.model.qwen35.compiled_steps", lambda *a, **kw: LayerSteps(broken, broken))
    cfg = EngineConfig(max_concurrency=2, max_pending=4, max_context=256, prefill_chunk=64)
    prompts = [tuple((i * 31 + j * 7) % 500 + 1 for j in range(n)) for i, n in enumerate((5, 40))]
    eager = Engine(small_model, replace(cfg, no_cuda_graph=True)).start()
    want = _generate(eager, prompts)
    eager.shutdown()
    engine = Engine(small_model, cfg)
    backend = EagerCapture()
    engine.runner = Runner(
        small_model, engine.kv, engine.states, engine.runner.max_pages, CPU, None,
        max_batch=2, capture=backend, compile=True,
    )  # fmt: skip
    assert small_model.layer_steps is not None
    engine.start()
    got = _generate(engine, prompts)
    engine.shutdown()
    stats = engine.runner.graph_stats
    assert stats is not None and stats.error is None and stats.batch_sizes == (1, 2)
    assert stats.compile_error is not None and "planted" in stats.compile_error
    assert small_model.layer_steps is None  # the eager layers run from now on
    assert got == want


def test_compiled_layer_steps_are_captured_in_layer_segments(monkeypatch, fresh_dynamo) -> None:
    """engine.compile: the captured decode steps run the compiled layer steps, cut between layers
    into segments as the eager ones are, with no graph break; the tokens are the eager engine's.
    (Dynamo alone, its `eager` backend: Inductor's kernels are checked in tests/model.)"""
    from torch._dynamo.utils import counters  # imports triton: after the interpreter tests set it up

    model = tiny_model(512, seed=0)  # its own: the compiled steps stay installed on it
    monkeypatch.setattr(
        "ninfer.model.qwen35.compiled_steps",
        lambda dynamic, backend, limit: compiled_steps(dynamic, "eager", limit),
    )
    cfg = EngineConfig(max_concurrency=2, max_pending=4, max_context=256, prefill_chunk=64)
    prompts = [tuple((i * 31 + j * 7) % 500 + 1 for j in range(n)) for i, n in enumerate((5, 40))]
    eager = Engine(model, replace(cfg, no_cuda_graph=True)).start()
    want = _generate(eager, prompts, temperature=0.0)
    eager.shutdown()
    engine = Engine(model, cfg)
    backend = EagerCapture()
    engine.runner = Runner(
        model, engine.kv, engine.states, engine.runner.max_pages, CPU, None,
        max_batch=2, capture=backend, compile=True, graph_segments=2,
    )  # fmt: skip
    engine.start()
    got = _generate(engine, prompts, temperature=0.0)
    engine.shutdown()
    stats = engine.runner.graph_stats
    assert stats is not None and stats.error is None and stats.compile_error is None
    assert stats.batch_sizes == (1, 2) and stats.graph_breaks == 0
    assert backend.segments == [2, 2] and counters["stats"]["unique_graphs"] > 0
    assert got == want
