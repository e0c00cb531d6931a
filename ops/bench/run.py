"""One-call GPU benchmark: builds full-size random-weight models, checks the fast path, times everything.

Usage (on a CUDA machine, from the repository root):

    python ops/bench/run.py --out ops/bench/results [--models qwen3.6-27b,qwen3.6-35b-a3b] [--quick]
        [--backend triton] [--compile MODELS] [--budget-s 540]

For each model shape (model-reference §2.5) it builds bf16 weights drawn from a normal
distribution directly on the GPU, checks the fast path's logits against the torch reference
path on the same GPU, then measures through the engine (not just the model): TTFT at 512 / 4k /
16k prompt tokens, decode tokens/s at batch 1, 2, 4, 8 at 4k context, 8k prefill tokens/s and
MFU, peak memory; and in the same run the HF transformers `generate` baseline on the same
weights, the device-to-device copy bandwidth, the bf16 matmul peak, and the decode roofline.
Decode runs replay the engine's CUDA graphs; the same run measures batch 1 eagerly, profiles one
eager decode step per batch size 1 and 8 (kernel time by category against wall time, kernels per
step), and with --compile the torch.compile'd decode step. The fast-path check is judged against
the reference path's own bf16 noise (`fast_path.py`). Each model runs in its own process (all its
GPU memory is returned before the next); the budget is shared out over the models, time one leaves
goes to the next, sections past a model's share are skipped (recorded as such). Writes
`DATE-COMMIT.json` (all models) under --out after every model and prints a short table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ninfer.engine.api import GenerationRequest, SamplingParams  # noqa: E402
from ninfer.engine.config import EngineConfig  # noqa: E402
from ninfer.engine.engine import Engine  # noqa: E402
from ninfer.kernels.dispatch import backends, get_ops  # noqa: E402
from ninfer.model.config import TextConfig  # noqa: E402
from ninfer.model.qwen35 import Qwen35Model  # noqa: E402
from ninfer.service.compile_cache import setup_compile_cache  # noqa: E402
from ops.bench.fast_path import check_fast_path  # noqa: E402

GiB = 1024**3

# Text-config shapes of the released checkpoints (model-reference §2.5).
_COMMON = dict(
    vocab_size=248320,
    head_dim=256,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    max_position_embeddings=262144,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10_000_000,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
)
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3.6-27b": dict(
        _COMMON,
        model_type="qwen3_5_text",
        hidden_size=5120,
        num_hidden_layers=64,
        intermediate_size=17408,
        num_attention_heads=24,
        num_key_value_heads=4,
        linear_num_key_heads=16,
        linear_num_value_heads=48,
    ),
    "qwen3.6-35b-a3b": dict(
        _COMMON,
        model_type="qwen3_5_moe_text",
        hidden_size=2048,
        num_hidden_layers=40,
        num_attention_heads=16,
        num_key_value_heads=2,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
    ),
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------- ceilings
def copy_bandwidth_TBps() -> float:
    """Device-to-device copy of 4 GiB, counting bytes read plus bytes written (median of 20)."""
    n = 2 * GiB // 2
    src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for i in range(25):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        torch.cuda.synchronize()
        if i >= 5:
            times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    del src, dst
    return 2 * n * 2 / times[len(times) // 2] / 1e12


def matmul_peak_TFLOPs() -> float:
    """bf16 8192^3 matrix product on random data (median of 20)."""
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    times = []
    for i in range(25):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        torch.cuda.synchronize()
        if i >= 5:
            times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    return 2 * 8192**3 / times[len(times) // 2] / 1e12


# ----------------------------------------------------------------------------- model
def build_model(name: str, backend: str) -> Qwen35Model:
    """Full-size model with N(0, 0.02) weights (norm offsets N(0, 0.1), A_log U(-1, 1)) on the GPU."""
    cfg = TextConfig.from_hf(SHAPES[name])
    gen = torch.Generator(device="cuda").manual_seed(0)
    ops = get_ops("cuda", backend)  # outside the meta context: backends probe kernels on the GPU
    with torch.device("meta"):
        model = Qwen35Model(cfg, ops)
    model = model.to_empty(device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("A_log"):
                p.uniform_(-1.0, 1.0, generator=gen)
            elif "norm" in pname:
                p.normal_(0.0, 0.1, generator=gen)
            elif pname.endswith("dt_bias"):
                p.normal_(0.0, 0.5, generator=gen)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    model.init_buffers("cuda")
    model.eval().requires_grad_(False)
    return model


def weight_bytes_per_token(model: Qwen35Model) -> int:
    """Bytes of weights one decode step must read at batch 1 (embedding: one row; MoE: top-k experts)."""
    cfg = model.config
    total = 0
    for pname, p in model.named_parameters():
        nbytes = p.numel() * p.element_size()
        if pname.startswith("embed_tokens"):
            nbytes = p.shape[1] * p.element_size()
        elif ".experts." in pname and cfg.num_experts:
            nbytes = nbytes * cfg.num_experts_per_tok // cfg.num_experts
        total += nbytes
    return total


def state_bytes_per_token(cfg: TextConfig, context: int) -> int:
    """KV bytes read (bf16) + GDN recurrent state read and written (fp32) per sequence per step."""
    kv = len(cfg.attention_layers) * 2 * cfg.num_key_value_heads * cfg.head_dim * 2 * context
    ssm = (
        len(cfg.linear_layers)
        * cfg.linear_num_value_heads
        * cfg.linear_key_head_dim
        * cfg.linear_value_head_dim
        * 4
        * 2
    )
    return kv + ssm


def prefill_flops_per_token(model: Qwen35Model, context: int) -> float:
    """2 x active non-embedding parameters + attention score/value FLOPs at average context/2."""
    cfg = model.config
    active = 0
    for pname, p in model.named_parameters():
        if pname.startswith("embed_tokens"):
            continue
        n = p.numel()
        if ".experts." in pname and cfg.num_experts:
            n = n * cfg.num_experts_per_tok // cfg.num_experts
        active += n
    attn = 4 * len(cfg.attention_layers) * cfg.num_attention_heads * cfg.head_dim * (context / 2)
    return 2 * active + attn


# ----------------------------------------------------------------------------- engine runs
def make_engine(
    model: Qwen35Model, max_context: int, lanes: int, chunk: int, graphs: bool = True, compile: bool = False
) -> Engine:
    cfg = EngineConfig(
        max_concurrency=lanes,
        max_pending=16,
        pending_timeout_ms=600_000,
        prefill_chunk=chunk,
        max_context=max_context,
        kv_capacity=max_context * lanes,
        no_prefix_reuse=True,
        device="cuda",
        dtype="bfloat16",
        no_cuda_graph=not graphs,
        compile=compile,
    )
    return Engine(model, cfg).start()


def random_prompt(n: int, seed: int, vocab: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, min(vocab, 240_000), (n,), generator=g).tolist())


def run_requests(engine: Engine, prompts: list[tuple[int, ...]], max_tokens: int) -> dict[str, float]:
    """Submit all prompts at once (greedy, ignore_eos). TTFT of the first request; decode tokens/s
    over the window in which every request is decoding (last first token .. first last token),
    and the runner's mean seconds per decode step (model + sampling) over the whole run."""
    stamps: list[list[float]] = [[] for _ in prompts]
    before = engine.counters.total.decode_seconds, engine.counters.total.decode_rounds
    t0 = time.perf_counter()

    def consume(i: int, handle: Any) -> None:
        for out in handle:
            stamps[i].extend([time.perf_counter()] * len(out.token_ids))

    threads = []
    for i, p in enumerate(prompts):
        req = GenerationRequest(
            request_id=f"bench-{i}",
            prompt_ids=p,
            params=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        )
        handle = engine.submit(engine.reserve(), req)
        th = threading.Thread(target=consume, args=(i, handle))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    start = max(st[0] for st in stamps)
    end = min(st[-1] for st in stamps)
    n = sum(sum(1 for t in st if start < t <= end) for st in stamps)
    secs = engine.counters.total.decode_seconds - before[0]
    rounds = engine.counters.total.decode_rounds - before[1]
    return {
        "ttft_s": stamps[0][0] - t0,
        "decode_tok_s": n / (end - start) if end > start else float("nan"),
        "step_ms": 1e3 * secs / max(rounds, 1),
        "tokens": float(sum(len(st) for st in stamps)),
    }


def _category(kernel: str) -> str:
    k = kernel.lower()
    for cat, keys in (
        ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "matmul", "splitk")),
        ("norm", ("_rms_kernel", "_gated_kernel", "_norm_rope_kernel", "norm")),
        ("attention", ("paged", "attention", "attn", "flash", "write_kv")),
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
                "_gate_up_kernel",
                "_down_kernel",
            ),
        ),
        ("copy", ("copy", "memcpy", "memset", "fill")),
    ):
        if any(x in k for x in keys):
            return cat
    return "elementwise/other"


def profile_decode_step(engine: Engine, bs: int, context: int) -> dict[str, Any]:
    """Kernel time of one eager decode step at `bs` rows (`context` tokens each) by category,
    against the step's wall time: sum(kernels) << wall means launch / host overhead."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    runner = engine.runner
    per = -(-(context + 1) // 64)
    pages = [list(range(i * per, (i + 1) * per)) for i in range(bs)]
    batch = runner._batch([[1]] * bs, [context] * bs, list(range(bs)), pages)
    with torch.inference_mode():
        for _ in range(3):
            runner._decode_logits(batch)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            runner._decode_logits(batch)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 5
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            runner._decode_logits(batch)
            torch.cuda.synchronize()
    cats: dict[str, float] = {}
    top: list[tuple[float, str, int]] = []
    launches = 0
    for ev in prof.key_averages():
        if getattr(ev, "device_type", DeviceType.CUDA) != DeviceType.CUDA:
            continue
        us = getattr(ev, "device_time_total", 0.0)
        if us <= 0:
            continue
        cat = _category(ev.key)
        cats[cat] = cats.get(cat, 0.0) + us / 1e3
        launches += ev.count
        top.append((us / 1e3, ev.key[:90], ev.count))
    top.sort(reverse=True)
    return {
        "bs": bs,
        "context": context,
        "eager_step_ms": wall * 1e3,
        "kernel_ms": sum(cats.values()),
        "kernels_per_step": launches,
        "kernel_ms_by_category": {k: round(v, 3) for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"ms": round(ms, 3), "name": n, "count": c} for ms, n, c in top[:15]],
    }


def hf_decode_tok_s(model: Qwen35Model, name: str, prompt_len: int, new_tokens: int) -> float | None:
    """transformers `generate` on the same weights (shared storage), batch 1, greedy."""
    try:
        import transformers
    except ImportError:
        return None
    hf = SHAPES[name]
    cls_cfg = (
        transformers.Qwen3_5MoeTextConfig
        if hf["model_type"].startswith("qwen3_5_moe")
        else transformers.Qwen3_5TextConfig
    )
    cls_model = (
        transformers.Qwen3_5MoeForCausalLM
        if hf["model_type"].startswith("qwen3_5_moe")
        else transformers.Qwen3_5ForCausalLM
    )
    kwargs = {k: v for k, v in hf.items() if k != "model_type"}
    config = cls_cfg(**kwargs)
    if hasattr(config, "experts_implementation"):
        config.experts_implementation = "grouped_mm"
    with torch.device("meta"):
        ref = cls_model(config)
    sd = {("model." + k if k != "lm_head.weight" else k): v for k, v in model.state_dict().items()}
    ref.load_state_dict(sd, strict=True, assign=True)
    for mod in ref.modules():  # rebuild the non-persistent rotary buffers that stayed on meta
        if hasattr(mod, "inv_freq") and mod.inv_freq.is_meta:
            fresh = type(mod)(mod.config)  # built on the CPU: its __init__ computes the buffers
            mod.inv_freq = fresh.inv_freq
            mod.original_inv_freq = fresh.original_inv_freq
    ref.to(device="cuda")
    ref.eval()
    ids = torch.tensor([random_prompt(prompt_len, 7, model.config.vocab_size)], device="cuda")
    with torch.inference_mode():
        ref.generate(ids, max_new_tokens=2, do_sample=False)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ref.generate(ids, max_new_tokens=1, do_sample=False, min_new_tokens=1)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        ref.generate(ids, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
    del ref
    return (new_tokens - 1) / ((t2 - t1) - (t1 - t0))


class Budget:
    """Skips sections once the run has used `seconds` (the device call has a hard limit)."""

    def __init__(self, seconds: float) -> None:
        self.t0, self.seconds = time.perf_counter(), seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)


def _free(*engines: Engine | None) -> None:
    for e in engines:
        if e is not None:
            e.shutdown(5)
    gc.collect()
    torch.cuda.empty_cache()


def bench_model(
    name: str,
    args: argparse.Namespace,
    bw_TBps: float,
    peak_TFLOPs: float,
    budget: Budget,
    save: Any,
    res: dict[str, Any],
) -> dict[str, Any]:
    """Every section for one model, filling `res` as it goes (`save()` writes it out)."""
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model = build_model(name, args.backend)
    res.update({"backend": args.backend, "skipped": []})
    res["build_s"] = time.perf_counter() - t0
    log(f"{name}: built in {res['build_s']:.1f}s, {torch.cuda.memory_allocated() / GiB:.1f} GiB")
    res["fast_path"] = check_fast_path(
        model, args.backend, list(random_prompt(300, 3, model.config.vocab_size))
    )
    log(f"{name}: fast path {res['fast_path']}")
    cfg = model.config
    ctx = 4096
    wb = weight_bytes_per_token(model)
    sb = state_bytes_per_token(cfg, ctx)
    res["roofline_bytes_per_step_bs1"] = wb + sb
    res["roofline_decode_tok_s_bs1"] = bw_TBps * 1e12 / (wb + sb)
    save()

    def section(title: str, need_s: float) -> bool:
        if title.split()[0] in args.skip.split(","):
            res["skipped"].append(title)
            return False
        if budget.left() < need_s:
            res["skipped"].append(title)
            log(f"{name}: skipped {title} ({budget.left():.0f}s left)")
            return False
        return True

    # decode with CUDA graphs at 4k context: the headline numbers
    batches = [1, 8] if args.quick else [1, 2, 4, 8]
    lanes = max(batches)
    res["decode_tok_s"], res["decode_step_ms"] = {}, {}
    eng = make_engine(model, ctx + args.decode_tokens + lanes + 64, lanes, args.prefill_chunk)
    run_requests(eng, [random_prompt(256, 99, cfg.vocab_size)], 4)  # warm-up (and graph capture)
    res["cuda_graphs"] = None if eng.runner.graph_stats is None else eng.runner.graph_stats.as_dict()
    log(f"{name}: graphs {res['cuda_graphs']}")
    for bs in batches:
        prompts = [random_prompt(ctx, 1000 * bs + i, cfg.vocab_size) for i in range(bs)]
        r = run_requests(eng, prompts, args.decode_tokens + bs)  # >= decode_tokens steps at full batch
        res["decode_tok_s"][str(bs)] = r["decode_tok_s"]
        res["decode_step_ms"][str(bs)] = r["step_ms"]
        log(
            f"{name}: decode bs={bs} at {ctx} ctx = {r['decode_tok_s']:.1f} tok/s (step {r['step_ms']:.2f} ms)"
        )
        save()
    res["roofline_fraction_bs1"] = res["decode_tok_s"]["1"] / res["roofline_decode_tok_s_bs1"]
    _free(eng)

    if section("eager decode + profile", 60):
        eng = make_engine(model, ctx + args.decode_tokens + 64, lanes, args.prefill_chunk, graphs=False)
        run_requests(eng, [random_prompt(256, 99, cfg.vocab_size)], 4)
        r = run_requests(eng, [random_prompt(ctx, 1000, cfg.vocab_size)], 32)
        res["eager_decode_tok_s_bs1"] = r["decode_tok_s"]
        log(f"{name}: eager decode bs=1 = {r['decode_tok_s']:.1f} tok/s")
        try:
            res["profile"] = [profile_decode_step(eng, bs, ctx) for bs in (1, lanes)]
        except Exception as exc:
            res["profile"] = [{"error": f"{type(exc).__name__}: {exc}"[:300]}]
        for p in res["profile"]:
            if "error" in p:
                log(f"{name}: profile failed: {p['error']}")
                continue
            log(
                f"{name}: profile bs={p['bs']}: wall {p['eager_step_ms']:.2f} ms, kernels {p['kernel_ms']:.2f} ms "
                f"{p['kernel_ms_by_category']}"
            )
        _free(eng)
        save()

    if name in args.compile.split(",") and section("compiled decode", 150):
        t1 = time.perf_counter()
        eng = make_engine(
            model, ctx + args.decode_tokens + lanes + 64, lanes, args.prefill_chunk, compile=True
        )
        try:
            run_requests(eng, [random_prompt(256, 99, cfg.vocab_size)], 4)
            res["compile"] = {"startup_s": time.perf_counter() - t1, "decode_tok_s": {}}
            res["compile"]["cuda_graphs"] = eng.runner.graph_stats and eng.runner.graph_stats.as_dict()
            for bs in (1, lanes):
                prompts = [random_prompt(ctx, 1000 * bs + i, cfg.vocab_size) for i in range(bs)]
                r = run_requests(eng, prompts, args.decode_tokens + bs)
                res["compile"]["decode_tok_s"][str(bs)] = r["decode_tok_s"]
                log(f"{name}: compiled decode bs={bs} = {r['decode_tok_s']:.1f} tok/s")
        except Exception as exc:
            res["compile"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        _free(eng)
        save()

    ttft_lens = [512, 4096] if args.quick else [512, 4096, 16384]
    if section("ttft", 60):
        eng = make_engine(model, max(ttft_lens) + 64, 1, args.prefill_chunk)
        run_requests(eng, [random_prompt(256, 99, cfg.vocab_size)], 4)
        res["ttft_ms"] = {}
        for n in ttft_lens:
            r = run_requests(eng, [random_prompt(n, n, cfg.vocab_size)], 1)
            res["ttft_ms"][str(n)] = r["ttft_s"] * 1e3
            log(f"{name}: ttft {n} = {r['ttft_s'] * 1e3:.1f} ms")
        _free(eng)
        save()

    n8k = 8192
    if section("prefill 8k", 45):
        eng = make_engine(model, n8k + 64, 1, args.prefill_chunk)
        run_requests(eng, [random_prompt(n8k, 9, cfg.vocab_size)], 1)  # warm-up at this chunk size
        r = run_requests(eng, [random_prompt(n8k, 8, cfg.vocab_size)], 1)
        res["prefill_tok_s_8k"] = n8k / r["ttft_s"]
        res["prefill_mfu_8k"] = (
            res["prefill_tok_s_8k"] * prefill_flops_per_token(model, n8k) / (peak_TFLOPs * 1e12)
        )
        log(f"{name}: prefill 8k {res['prefill_tok_s_8k']:.0f} tok/s, MFU {res['prefill_mfu_8k']:.3f}")
        _free(eng)
        save()

    res["int8_kv"] = {"status": "not measured: kv_dtype=int8 is not wired into the engine yet"}
    res["peak_mem_GiB"] = torch.cuda.max_memory_allocated() / GiB
    if not args.no_hf and section("hf baseline", 60):
        try:
            res["hf_decode_tok_s_bs1"] = hf_decode_tok_s(model, name, 512, args.hf_tokens)
            res["hf_context"] = 512
            log(f"{name}: HF generate bs1 = {res['hf_decode_tok_s_bs1']:.2f} tok/s")
        except Exception as exc:  # the baseline must not hide our own numbers
            res["hf_decode_tok_s_bs1"] = None
            res["hf_error"] = f"{type(exc).__name__}: {exc}"[:500]
            log(f"{name}: HF baseline failed: {res['hf_error']}")
    del model
    _free()
    return res


def run_one_model(args: argparse.Namespace) -> None:
    """Child mode (--one-model): bench one model in this process, its results as JSON in --child-out
    after every section (a crash or timeout keeps what was measured)."""
    budget = Budget(args.budget_s)
    setup_compile_cache()
    path = Path(args.child_out)
    res: dict[str, Any] = {}

    def save() -> None:
        path.write_text(json.dumps(res, indent=2, default=str) + "\n")

    try:
        res.update(bench_model(args.one_model, args, args.bw_tbps, args.peak_tflops, budget, save, res))
    except Exception as exc:  # keep what was measured, say what failed
        res["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        log(f"{args.one_model}: FAILED {res['error']}")
    save()


def run_child(name: str, args: argparse.Namespace, bw: float, peak: float, seconds: float) -> dict[str, Any]:
    """Bench `name` in a fresh process (all its GPU memory is returned when it exits); its stdout
    and stderr go to ours. Returns its results, or what it wrote before failing plus the error."""
    child_out = Path(args.out) / f".child-{name}.json"
    child_out.unlink(missing_ok=True)
    argv = [sys.executable, str(Path(__file__).resolve()), "--one-model", name, "--child-out", str(child_out),
            "--bw-tbps", str(bw), "--peak-tflops", str(peak), "--budget-s", str(seconds),
            "--backend", args.backend, "--prefill-chunk", str(args.prefill_chunk),
            "--decode-tokens", str(args.decode_tokens), "--hf-tokens", str(args.hf_tokens),
            "--compile", args.compile, "--skip", args.skip, "--out", args.out]  # fmt: skip
    argv += ["--no-hf"] * args.no_hf + ["--quick"] * args.quick
    try:
        rc = subprocess.run(argv, cwd=ROOT, timeout=seconds + 120).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    res: dict[str, Any] = json.loads(child_out.read_text()) if child_out.exists() else {}
    child_out.unlink(missing_ok=True)
    if rc != 0 and "error" not in res:
        res["error"] = f"bench process for {name} ended with {rc}"
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "ops/bench/results"))
    ap.add_argument("--models", default="qwen3.6-27b,qwen3.6-35b-a3b")
    default_backend = "triton" if "triton" in backends() else "reference"
    ap.add_argument("--backend", default=default_backend, choices=sorted(backends()), help="kernel backend")
    ap.add_argument("--prefill-chunk", type=int, default=8192)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--hf-tokens", type=int, default=16)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer sizes (512/4k TTFT, batch 1 and 8)")
    ap.add_argument(
        "--compile", default="", help="models (comma list) whose torch.compile'd decode is also timed"
    )
    ap.add_argument("--skip", default="", help="sections to leave out: eager,ttft,prefill,hf (comma list)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="skip later sections past this")
    # child mode: one model in this process (the parent runs each model in its own process)
    ap.add_argument("--one-model", default="", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--bw-tbps", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--peak-tflops", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ops/bench/run.py needs a CUDA device")
    if args.one_model:
        run_one_model(args)
        return
    budget = Budget(args.budget_s)
    cache = setup_compile_cache()
    import triton

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or os.environ.get("NINFER_COMMIT", "unknown")
    result: dict[str, Any] = {
        "commit": commit,
        "uncommitted_files": len(git("status", "--short", "--untracked-files=no").splitlines()),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "command": " ".join(["python", "ops/bench/run.py", *sys.argv[1:]]),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{dt.date.today().isoformat()}-{commit}.json"

    def save() -> None:
        path.write_text(json.dumps(result, indent=2, default=str) + "\n")

    result["copy_bandwidth_TBps"] = copy_bandwidth_TBps()
    result["matmul_bf16_TFLOPs"] = matmul_peak_TFLOPs()
    log(f"copy {result['copy_bandwidth_TBps']:.2f} TB/s, matmul {result['matmul_bf16_TFLOPs']:.0f} TFLOP/s")
    gc.collect()
    torch.cuda.empty_cache()  # the children need the memory
    result["models"] = {}
    names = args.models.split(",")
    for i, name in enumerate(names):
        share = max(budget.left(), 0.0) / (len(names) - i)  # time a model leaves goes to the next
        result["models"][name] = run_child(
            name, args, result["copy_bandwidth_TBps"], result["matmul_bf16_TFLOPs"], share
        )
        if "error" in result["models"][name]:
            log(f"{name}: {result['models'][name]['error']}")
        save()
    result["compile_cache"] = cache.report()
    result["wall_s"] = time.perf_counter() - budget.t0
    save()
    print(f"\nwrote {path}")
    print(
        f"{'model':18} {'bs1':>7} {'bs2':>7} {'bs4':>7} {'bs8':>7} {'roof1':>7} {'eager1':>7} {'hf1':>6} "
        f"{'ttft4k':>7} {'pf8k':>7} {'mfu':>6} {'kern1':>6} {'fp_err':>7} {'noise':>7} {'fp':>4}"
    )
    nan = float("nan")
    for name, r in result["models"].items():
        if "error" in r:
            print(f"{name:18} ERROR {r['error'][:200]}")
        if "decode_tok_s" not in r:
            continue
        d = r.get("decode_tok_s", {})
        prof = next((p for p in r.get("profile", []) if p.get("bs") == 1), {})
        fp = r.get("fast_path", {})
        noise = max(fp.get("reference_noise", {}).values(), default=nan)
        print(
            f"{name:18} {d.get('1', nan):7.1f} {d.get('2', nan):7.1f} {d.get('4', nan):7.1f} {d.get('8', nan):7.1f} "
            f"{r['roofline_decode_tok_s_bs1']:7.1f} {r.get('eager_decode_tok_s_bs1', nan):7.1f} "
            f"{r.get('hf_decode_tok_s_bs1') or nan:6.2f} {r.get('ttft_ms', {}).get('4096', nan):7.1f} "
            f"{r.get('prefill_tok_s_8k', nan):7.0f} {r.get('prefill_mfu_8k', nan):6.3f} "
            f"{prof.get('kernels_per_step', -1):6d} {fp.get('rel_err_last_logits', nan):7.4f} {noise:7.4f} "
            f"{'ok' if fp.get('ok') else 'FAIL':>4}"
        )


if __name__ == "__main__":
    main()
