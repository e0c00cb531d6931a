"""Timed runs through the engine: concurrent greedy requests, one profiled eager decode step."""

from __future__ import annotations

import dataclasses
import functools
import gc
import threading
import time
from typing import Any

import torch

from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.types import GenerationRequest, SamplingParams
from ninfer.model.qwen35 import Qwen35Model
from ops.bench.ceilings import median_seconds, sync


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """Where and how the engines of one model run."""

    device: str
    dtype: str  # EngineConfig.dtype
    chunk: int  # prefill chunk


def make_engine(
    model: Qwen35Model,
    es: EngineSpec,
    max_context: int,
    lanes: int,
    cuda_graph: bool = True,
    draft_head: Any = None,
    prefix_reuse: bool = False,
    **extra: Any,
) -> Engine:
    """A started engine over `model`; `extra` sets further EngineConfig fields (compile, spec_*);
    `draft_head`: the proposal head for `lm_head_draft=True`; prefix reuse off unless asked for."""
    cfg = EngineConfig(
        max_concurrency=lanes,
        max_pending=16,
        pending_timeout_ms=600_000,
        prefill_chunk=es.chunk,
        max_context=max_context,
        kv_capacity=max_context * lanes,
        no_prefix_reuse=not prefix_reuse,
        device=es.device,
        dtype=es.dtype,
        no_cuda_graph=not cuda_graph or not es.device.startswith("cuda"),
        **extra,
    )
    return Engine(model, cfg, draft_head=draft_head).start()


def free(*engines: Engine | None) -> None:
    for e in engines:
        if e is not None:
            e.shutdown(5)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# the models' default thinking-mode sampling (generation_config.json, the served preset)
THINKING_SAMPLING = {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "presence_penalty": 1.5}


def run_requests(
    engine: Engine,
    prompts: list[tuple[int, ...]],
    max_tokens: int,
    sampling: dict[str, float] | None = None,
    ids_out: list[list[int]] | None = None,
) -> dict[str, float]:
    """Submit all prompts at once (greedy unless `sampling` gives SamplingParams fields, seeded per
    request; ignore_eos). TTFT of the first request; decode tokens/s
    over the window in which every request is decoding (last first token .. first last token),
    and the runner's mean seconds per decode step (model + sampling) over the whole run; with
    speculation, the drafted and accepted tokens of all requests (their request-log counters).
    `ids_out` (when given) receives each request's generated token ids, in prompt order."""
    stamps: list[list[float]] = [[] for _ in prompts]
    ids: list[list[int]] = [[] for _ in prompts]
    spec: list[dict[str, Any]] = [{} for _ in prompts]  # each request's speculative counters
    errors: list[BaseException] = []
    before = engine.counters.total.decode_seconds, engine.counters.total.decode_rounds
    t0 = time.perf_counter()

    def consume(i: int, handle: Any) -> None:
        try:
            with handle:  # releases the lifetime ticket, as a server does after the response
                for out in handle:
                    stamps[i].extend([time.perf_counter()] * len(out.token_ids))
                    ids[i].extend(out.token_ids)
            spec[i] = dict(handle.stats.speculative or {})
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = []
    for i, p in enumerate(prompts):
        req = GenerationRequest(
            request_id=f"bench-{i}",
            prompt_ids=p,
            params=SamplingParams(
                max_tokens=max_tokens,
                ignore_eos=True,
                **(sampling or {"temperature": 0.0}),
                seed=None if sampling is None else 1234 + i,
            ),
        )
        handle = engine.submit(engine.reserve(), req)
        th = threading.Thread(target=consume, args=(i, handle))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    if ids_out is not None:
        ids_out[:] = ids
    if any(len(st) != max_tokens for st in stamps):
        raise RuntimeError(f"expected {max_tokens} tokens per request, got {[len(st) for st in stamps]}")
    start = max(st[0] for st in stamps)
    end = min(st[-1] for st in stamps)
    n = sum(sum(1 for t in st if start < t <= end) for st in stamps)
    secs = engine.counters.total.decode_seconds - before[0]
    rounds = engine.counters.total.decode_rounds - before[1]
    return {
        "ttft_s": stamps[0][0] - t0,
        "decode_tok_s": n / (end - start) if end > start else float("nan"),
        "window_start": start,
        "window_end": end,
        "window_s": end - start,
        "window_tokens": float(n),
        "step_ms": 1e3 * secs / max(rounds, 1),
        "tokens": float(sum(len(st) for st in stamps)),
        "accepted_tokens": float(sum(c.get("accepted_tokens", 0) for c in spec)),
        "drafted_tokens": float(sum(c.get("drafted_tokens", 0) for c in spec)),
    }


def category(kernel: str) -> str:
    """Coarse kernel category by name (GEMM, GEMV, norm, attention, GDN, MoE, copy, other). GEMV is
    the decode projections' Triton kernels (bf16 and quantized) with their split-K sums: the
    weight streaming itself, apart from the small glue kernels "other" should count."""
    k = kernel.lower()
    for cat, keys in (
        (
            "gemv",
            ("_gemv_kernel", "qgemv", "_split_sum_kernel", "_mma_kernel", "_lanes_kernel", "_words_kernel"),
        ),
        ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "matmul", "splitk", "aten::mm", "aten::bmm")),
        ("norm", ("_rms_kernel", "_gated_kernel", "_norm_rope_kernel", "norm")),
        ("attention", ("paged", "attention", "attn", "flash", "write_kv", "combine_splits")),
        ("gdn", ("gdn", "delta", "conv", "fused_recurrent")),
        (
            "moe",
            (
                "grouped",
                "moe",
                "expert",
                "sort",
                "histogram",
                "scatter",
                "gather",
                "index",
                "_route_kernel",
                "gate_up_kernel",
                "down_kernel",
            ),
        ),
        ("copy", ("copy", "memcpy", "memset", "fill")),
    ):
        if any(x in k for x in keys):
            return cat
    return "elementwise/other"


def graph_replay_ms(engine: Engine, bs: int, reps: int = 20) -> float | None:
    """Mean ms of the captured decode graph of `bs` rows replayed back to back (its last inputs,
    no host work between replays): the step's GPU time including the gaps between its kernels.
    Against the runner's step time it isolates the host's share; None without that graph."""
    graphs = engine.runner.graphs
    if graphs is None or not graphs.has(bs):
        return None
    dev = torch.device(engine.config.device)
    replay = functools.partial(graphs.replay, bs, 1)
    replay()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        replay()
    sync(dev)
    return (time.perf_counter() - t0) * 1e3 / reps


def decode_round(engine: Engine, bs: int, context: int, reps: int = 10) -> dict[str, Any]:
    """One decode round as the engine thread runs it (`Runner.execute` of a greedy DecodePlan:
    pack, copy, graph replay, in-graph argmax, one transfer), on the idle engine: the median ms
    and where the host's time goes (`host_profile`). Against `graph_replay_ms` it splits the
    step's host share; the rest of a round (commit, outputs, scheduling) is outside it."""
    from ninfer.engine.plan import DecodePlan, DecodeRow
    from ninfer.engine.sampler import RowSampler, SamplingOverrides, resolve_sampling

    dev = torch.device(engine.config.device)
    per = -(-(context + 1) // 64)
    greedy = RowSampler(resolve_sampling(SamplingParams(temperature=0.0), None, SamplingOverrides()))
    rows = [
        DecodeRow(i, 1 + 7 * i, context, i, list(range(i * per, (i + 1) * per)), greedy) for i in range(bs)
    ]
    plan = DecodePlan(rows)

    def run() -> None:
        engine.runner.execute(plan)

    with torch.inference_mode():
        ms = median_seconds(run, dev, reps, 3) * 1e3
        return {"round_ms": ms, "host_profile": host_profile(run, dev)}


def profile_decode_step(engine: Engine, bs: int, context: int) -> dict[str, Any]:
    """Kernel time of one eager decode step at `bs` rows (`context` tokens each) by category,
    against the step's wall time: sum(kernels) << wall means launch / host overhead. On a CPU
    device the operators' self CPU time stands in for kernel time."""
    from torch.profiler import ProfilerActivity, profile

    runner = engine.runner
    dev = torch.device(engine.config.device)
    cuda = dev.type == "cuda"
    per = -(-(context + 1) // 64)
    pages = [list(range(i * per, (i + 1) * per)) for i in range(bs)]
    # a distinct token per row: identical rows would route every MoE row to the same experts
    batch = runner._batch([[1 + 7 * i] for i in range(bs)], [context] * bs, list(range(bs)), pages)
    with torch.inference_mode():
        for _ in range(3):
            runner._decode_logits(batch)
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(5):
            runner._decode_logits(batch)
        sync(dev)
        wall = (time.perf_counter() - t0) / 5
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            runner._decode_logits(batch)
            sync(dev)
    return {"bs": bs, "context": context, "eager_step_ms": wall * 1e3, **kernel_table(prof, cuda)}


def kernel_table(prof: Any, cuda: bool) -> dict[str, Any]:
    """A finished torch profiler's kernels (their self CPU time on a CPU) as the bench's table:
    total ms, launches, ms by category and the 15 costliest kernels."""
    from torch.autograd import DeviceType

    want = DeviceType.CUDA if cuda else DeviceType.CPU
    cats: dict[str, float] = {}
    top: list[tuple[float, str, int]] = []
    launches = 0
    for ev in prof.key_averages():
        if getattr(ev, "device_type", want) != want:
            continue
        us = getattr(ev, "device_time_total", 0.0) if cuda else ev.self_cpu_time_total
        if us <= 0:
            continue
        cat = category(ev.key)
        cats[cat] = cats.get(cat, 0.0) + us / 1e3
        launches += ev.count
        top.append((us / 1e3, ev.key[:90], ev.count))
    top.sort(reverse=True)
    return {
        "kernel_ms": sum(cats.values()),
        "kernels_per_step": launches,
        "kernel_ms_by_category": {k: round(v, 3) for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"ms": round(ms, 3), "name": n, "count": c} for ms, n, c in top[:15]],
    }


def host_profile(fn: Any, dev: torch.device, reps: int = 5) -> dict[str, Any]:
    """Where the host's time goes in `fn` (one engine round, synchronized before and after):
    CPU ops and CUDA runtime calls by self CPU time per call of `fn`, over `reps` profiled calls
    (the profiler adds a few µs per op; compare the ranks, not the sum, with the timed rows)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
            sync(dev)
    rows = [
        (ev.self_cpu_time_total / reps, ev.key[:80], ev.count / reps)
        for ev in prof.key_averages()
        if getattr(ev, "device_type", DeviceType.CPU) == DeviceType.CPU and ev.self_cpu_time_total > 0
    ]
    rows.sort(reverse=True)
    return {
        "self_cpu_ms": round(sum(r[0] for r in rows) / 1e3, 4),
        "top": [{"us": round(us, 1), "name": n, "calls": c} for us, n, c in rows[:20]],
    }
