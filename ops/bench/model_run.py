"""Every section of one model's benchmark, in order, filling its result dict as it goes."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from ninfer.model.config import TextConfig
from ops.bench.engine_runs import (
    THINKING_SAMPLING,
    EngineSpec,
    decode_round,
    free,
    graph_replay_ms,
    make_engine,
    profile_decode_step,
    run_requests,
)
from ops.bench.fast_path import check_fast_path
from ops.bench.hf_baseline import hf_decode_tok_s
from ops.bench.int8_kv import int8_kv_section
from ops.bench.shapes import (
    bits_per_weight,
    build_model,
    hf_shape,
    prefill_flops_per_token,
    random_prompt,
    state_bytes_per_token,
    weight_bytes_per_token,
)
from ops.bench.spec_rows import SpecSizes, spec_section

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Lengths and counts of every section (full run, --quick, or --smoke)."""

    context: int  # decode context
    batches: tuple[int, ...]
    ttft_lens: tuple[int, ...]
    prefill_tokens: int  # the `prefill_tok_s_8k` prompt
    hf_prompt: int
    fast_path_prompt: int
    spec: SpecSizes


def dynamo_counts() -> dict[str, Any]:
    """Dynamo's graph breaks (with their reasons) and compiled graphs in this process."""
    from torch._dynamo.utils import counters

    breaks = counters["graph_break"]
    return {
        "graph_breaks_total": sum(breaks.values()),
        "graph_break_reasons": {k[:200]: v for k, v in list(breaks.items())[:10]},
        "unique_graphs": counters["stats"]["unique_graphs"],
    }


def identity(eager: list[list[int]], compiled: list[list[int]]) -> dict[str, Any]:
    """How many rows' greedy tokens are equal, and where the first difference of each other row is."""
    pairs = list(zip(eager, compiled, strict=True))
    first = [
        next((i for i, (x, y) in enumerate(zip(e, c, strict=False)) if x != y), min(len(e), len(c)))
        for e, c in pairs
        if e != c
    ]
    return {"rows": len(pairs), "identical": sum(e == c for e, c in pairs), "first_diff": first}


def sizes_for(smoke: bool, quick: bool, decode_tokens: int, proposal_ids: int) -> Sizes:
    if smoke:
        spec = SpecSizes((1, 3), (100, 40), (1, 2), 64, decode_tokens, proposal_ids)
        return Sizes(64, (1, 2), (32, 64, 128), 128, 32, 96, spec)
    batches = (1, 8) if quick else (1, 2, 4, 8)
    spec = SpecSizes(
        (1, 3, 5) if quick else (1, 2, 3, 4, 5), (100, 70, 40), (1, 8), 4096, decode_tokens, proposal_ids
    )
    ttft = (512, 4096) if quick else (512, 4096, 16384)
    return Sizes(4096, batches, ttft, 8192, 512, 300, spec)


@dataclasses.dataclass(frozen=True)
class ModelArgs:
    name: str
    smoke: bool
    backend: str
    es: EngineSpec
    sizes: Sizes
    decode_tokens: int
    hf_tokens: int
    skip: tuple[str, ...]  # first words of section titles
    compile: bool
    no_hf: bool
    weights: str = "bf16"  # the weight profile the model's tensors take


def bench_model(
    a: ModelArgs,
    bw_TBps: float,
    peak_TFLOPs: float,
    left: Callable[[], float],
    save: Callable[[], None],
    res: dict[str, Any],
    log: Callable[[str], None],
) -> None:
    """Every section for one model into `res` (`save()` writes it out after each)."""
    dev = torch.device(a.es.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    shape = hf_shape(a.name, a.smoke)
    dtype = getattr(torch, a.es.dtype)
    t0 = time.perf_counter()
    model = build_model(shape, a.backend, a.es.device, dtype, a.weights)
    res.update({"backend": a.backend, "device": a.es.device, "smoke": a.smoke, "skipped": []})
    res["weights"], res["bits_per_weight"] = a.weights, bits_per_weight(model)
    res["weight_bytes"] = model.weight_bytes()
    res["build_s"] = time.perf_counter() - t0
    cfg, sz = model.config, a.sizes
    log(f"{a.name}: built in {res['build_s']:.1f}s")
    prompt = list(random_prompt(sz.fast_path_prompt, 3, cfg.vocab_size))
    res["fast_path"] = check_fast_path(model, a.backend, prompt, device=a.es.device)
    log(f"{a.name}: fast path ok={res['fast_path'].get('ok')} checked={res['fast_path']['checked']}")
    ctx = sz.context
    wb, sb = weight_bytes_per_token(model), state_bytes_per_token(cfg, ctx, dtype.itemsize)
    res["roofline_bytes_per_step_bs1"] = wb + sb
    res["roofline_decode_tok_s_bs1"] = bw_TBps * 1e12 / (wb + sb)
    save()

    def section(title: str, need_s: float) -> bool:
        if title.split()[0] in a.skip or left() < need_s:
            res["skipped"].append(title)
            log(f"{a.name}: skipped {title} ({left():.0f}s left)")
            return False
        return True

    need = (lambda s: 0.0) if a.smoke else (lambda s: s)  # smoke: every section runs
    lanes = max(sz.batches)
    res["decode_tok_s"], res["decode_step_ms"], res["decode_context"] = {}, {}, ctx
    res["compiled"] = (
        False  # these decode figures: the eager step in CUDA graphs (`compile`: the compiled one)
    )
    eng = make_engine(model, a.es, ctx + a.decode_tokens + lanes + 64, lanes)
    run_requests(eng, [random_prompt(min(256, ctx), 99, cfg.vocab_size)], 4)  # warm-up, graph capture
    res["cuda_graphs"] = None if eng.runner.graph_stats is None else eng.runner.graph_stats.as_dict()
    eager_ids: dict[int, list[list[int]]] = {}  # greedy tokens per batch: the compiled step's identity
    for bs in sz.batches:
        prompts = [random_prompt(ctx, 1000 * bs + i, cfg.vocab_size) for i in range(bs)]
        eager_ids[bs] = []
        r = run_requests(eng, prompts, a.decode_tokens + bs, ids_out=eager_ids[bs])  # >= decode_tokens steps
        res["decode_tok_s"][str(bs)], res["decode_step_ms"][str(bs)] = r["decode_tok_s"], r["step_ms"]
        log(f"{a.name}: decode bs={bs} at {ctx} = {r['decode_tok_s']:.1f} tok/s (step {r['step_ms']:.2f} ms)")
        save()
    res["roofline_fraction_bs1"] = res["decode_tok_s"]["1"] / res["roofline_decode_tok_s_bs1"]
    # the same batches at the models' default thinking-mode sampling (top-k / top-p / presence penalty)
    res["sampling"], res["sampling_tok_s"], res["sampling_over_greedy"] = THINKING_SAMPLING, {}, {}
    for bs in sorted({1, lanes}):
        prompts = [random_prompt(ctx, 2000 * bs + i, cfg.vocab_size) for i in range(bs)]
        r = run_requests(eng, prompts, a.decode_tokens + bs, THINKING_SAMPLING)
        res["sampling_tok_s"][str(bs)] = r["decode_tok_s"]
        res["sampling_over_greedy"][str(bs)] = r["decode_tok_s"] / res["decode_tok_s"][str(bs)]
        log(f"{a.name}: thinking-mode sampling bs={bs} = {r['decode_tok_s']:.1f} tok/s")
        save()
    # the engine is idle: replaying a graph rewrites only the pages and slots of its last (finished) batch
    res["graph_replay_ms"] = {str(bs): graph_replay_ms(eng, bs) for bs in sz.batches}
    log(f"{a.name}: graph replay ms {res['graph_replay_ms']}")
    res["decode_round"] = {str(bs): decode_round(eng, bs, ctx) for bs in sorted({1, lanes})}
    log(
        f"{a.name}: decode round ms { ({b: round(r['round_ms'], 3) for b, r in res['decode_round'].items()}) }"
    )
    free(eng)

    if section("eager decode + profile", need(60)):
        eng = make_engine(model, a.es, ctx + a.decode_tokens + 64, lanes, cuda_graph=False)
        run_requests(eng, [random_prompt(min(256, ctx), 99, cfg.vocab_size)], 4)
        r = run_requests(eng, [random_prompt(ctx, 1000, cfg.vocab_size)], min(32, a.decode_tokens))
        res["eager_decode_tok_s_bs1"] = r["decode_tok_s"]
        try:
            res["profile"] = [profile_decode_step(eng, bs, ctx) for bs in (1, lanes)]
            res["kernels_per_step"] = {str(p["bs"]): p.get("kernels_per_step") for p in res["profile"]}
        except Exception as exc:
            res["profile"] = [{"error": f"{type(exc).__name__}: {exc}"[:300]}]
            log(f"{a.name}: profile failed: {res['profile'][0]['error']}")
        free(eng)
        save()

    if a.compile and section("compiled decode", need(150)):
        t1 = time.perf_counter()
        eng = make_engine(model, a.es, ctx + a.decode_tokens + lanes + 64, lanes, compile=True)
        try:
            run_requests(eng, [random_prompt(min(256, ctx), 99, cfg.vocab_size)], 4)
            gs = eng.runner.graph_stats
            res["compile"] = {
                "startup_s": time.perf_counter() - t1,
                "decode_tok_s": {},
                "graph_breaks": None if gs is None else gs.graph_breaks,
                "compile_error": None if gs is None else gs.compile_error,  # fell back to the eager layers
            }
            res["compile"]["greedy_identical"] = {}  # the eager graphs' tokens on the same prompts
            for bs in (1, lanes):
                prompts = [random_prompt(ctx, 1000 * bs + i, cfg.vocab_size) for i in range(bs)]
                ids: list[list[int]] = []
                r = run_requests(eng, prompts, a.decode_tokens + bs, ids_out=ids)
                res["compile"]["decode_tok_s"][str(bs)] = r["decode_tok_s"]
                res["compile"]["greedy_identical"][str(bs)] = identity(eager_ids[bs], ids)
                log(
                    f"{a.name}: compiled decode bs={bs} = {r['decode_tok_s']:.1f} tok/s, "
                    f"identical {res['compile']['greedy_identical'][str(bs)]}"
                )
            res["compile"].update(dynamo_counts())  # after the runs: any break or recompile they added
        except Exception as exc:
            res["compile"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        free(eng)
        model.eager_layers()  # the compiled steps were installed on the model: later sections run eager
        save()

    if section("ttft", need(60)):
        eng = make_engine(model, a.es, max(sz.ttft_lens) + 64, 1)
        run_requests(eng, [random_prompt(min(256, ctx), 99, cfg.vocab_size)], 4)
        res["ttft_ms"] = {}
        for n in sz.ttft_lens:  # a first prompt of each length pays Triton JIT / fla autotuning
            run_requests(eng, [random_prompt(n, n + 1, cfg.vocab_size)], 1)
            r = run_requests(eng, [random_prompt(n, n, cfg.vocab_size)], 1)
            res["ttft_ms"][str(n)] = r["ttft_s"] * 1e3
            log(f"{a.name}: ttft {n} = {r['ttft_s'] * 1e3:.1f} ms")
        free(eng)
        save()

    n = sz.prefill_tokens
    if section("prefill", need(45)):
        eng = make_engine(model, a.es, n + 64, 1)
        run_requests(eng, [random_prompt(n, 9, cfg.vocab_size)], 1)  # warm-up at this chunk size
        r = run_requests(eng, [random_prompt(n, 8, cfg.vocab_size)], 1)
        res["prefill_tokens"] = n
        res["prefill_tok_s_8k"] = n / r["ttft_s"]
        res["prefill_mfu_8k"] = (
            res["prefill_tok_s_8k"] * prefill_flops_per_token(model, n) / (peak_TFLOPs * 1e12)
        )
        log(f"{a.name}: prefill {n} {res['prefill_tok_s_8k']:.0f} tok/s, MFU {res['prefill_mfu_8k']:.3f}")
        free(eng)
        save()

    if section("int8 kv", need(90)):
        try:
            res["int8_kv"] = int8_kv_section(
                model, a.es, ctx, sz.batches, a.decode_tokens, res["decode_tok_s"], log
            )
        except Exception as exc:  # keep the other sections' numbers
            res["int8_kv"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            log(f"{a.name}: int8 kv failed: {res['int8_kv']['error']}")
        save()
    if section("spec", need(120)):
        res["spec"] = spec_section(model, a.es, sz.spec, res["decode_tok_s"], left, log)
        save()

    res["peak_mem_GiB"] = torch.cuda.max_memory_allocated() / GiB if cuda else None
    res["peak_gpu_bytes"] = torch.cuda.max_memory_allocated() if cuda else None
    if not a.no_hf and section("hf baseline", need(60)):
        try:
            res["hf_decode_tok_s_bs1"] = hf_decode_tok_s(model, shape, sz.hf_prompt, a.hf_tokens)
            res["hf_context"] = sz.hf_prompt
            log(f"{a.name}: HF generate bs1 = {res['hf_decode_tok_s_bs1']:.2f} tok/s")
        except Exception as exc:  # the baseline must not hide our own numbers
            res["hf_decode_tok_s_bs1"] = None
            res["hf_error"] = f"{type(exc).__name__}: {exc}"[:500]
            log(f"{a.name}: HF baseline failed: {res['hf_error']}")
    del model
    free()
    if a.weights != "bf16" and section("quant error", need(90)):  # against the bf16 model it encodes
        from ninfer.artifact.synth import synth_config
        from ops.bench.quant_error import measure

        qcfg = TextConfig.from_hf(shape) if a.smoke else synth_config(a.name, 4, mtp=False)
        res["quant_error"] = measure(qcfg, a.name, [a.weights], device=a.es.device, backend=a.backend,
                                     prompts=1 if a.smoke else 4, tokens=96 if a.smoke else 256)  # fmt: skip
        q = res["quant_error"]["profiles"][a.weights]
        log(
            f"{a.name}: quant error top1 {q['top1_agree']:.3f} KL {q['kl_mean']:.2e} (bf16 noise "
            f"{res['quant_error']['bf16_noise']['top1_agree']:.3f} / {res['quant_error']['bf16_noise']['kl_mean']:.2e})"
        )
        save()
