"""One-call GPU benchmark: builds full-size random-weight models, checks the fast path, times everything.

Usage (on a CUDA machine, from the repository root):

    python ops/bench/run.py --out ops/bench/results [--models qwen3.6-27b,qwen3.6-35b-a3b] [--quick]

For each model shape (model-reference §2.5) it builds bf16 weights drawn from a normal
distribution directly on the GPU, checks the fast path's logits against the torch reference
path on the same GPU, then measures through the engine (not just the model): TTFT at 512 / 4k /
16k prompt tokens, decode tokens/s at batch 1, 2, 4, 8 at 4k context, 8k prefill tokens/s and
MFU, peak memory; and in the same run the HF transformers `generate` baseline on the same
weights, the device-to-device copy bandwidth, the bf16 matmul peak, and the decode roofline.
Writes `DATE-COMMIT.json` under --out and prints a short table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
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
    with torch.device("meta"):
        model = Qwen35Model(cfg, get_ops("cuda", backend))
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
def make_engine(model: Qwen35Model, max_context: int, lanes: int, chunk: int) -> Engine:
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
    )
    return Engine(model, cfg).start()


def random_prompt(n: int, seed: int, vocab: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, 240_000, (n,), generator=g).tolist())


def run_requests(engine: Engine, prompts: list[tuple[int, ...]], max_tokens: int) -> dict[str, float]:
    """Submit all prompts at once (greedy, ignore_eos); return TTFT and aggregate decode tokens/s."""
    first: list[float] = [0.0] * len(prompts)
    last: list[float] = [0.0] * len(prompts)
    counts: list[int] = [0] * len(prompts)
    t0 = time.perf_counter()

    def consume(i: int, handle: Any) -> None:
        for out in handle:
            now = time.perf_counter()
            if counts[i] == 0 and out.token_ids:
                first[i] = now
            counts[i] += len(out.token_ids)
            last[i] = now

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
    decode_start = max(first)
    decode_end = max(last)
    decoded = sum(c - 1 for c in counts)
    return {
        "ttft_s": first[0] - t0,
        "decode_tok_s": decoded / max(decode_end - decode_start, 1e-9),
        "tokens": float(sum(counts)),
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
    ref.to(device="cuda")  # rotary buffers
    for mod in ref.modules():  # rebuild non-persistent buffers that stayed on meta
        if hasattr(mod, "inv_freq") and mod.inv_freq.is_meta:
            inv, _ = mod.rope_init_fn(mod.config, torch.device("cuda"))
            mod.inv_freq = inv
            mod.original_inv_freq = inv
    ref.eval()
    ids = torch.tensor([random_prompt(prompt_len, 7, 0)], device="cuda")
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


def check_fast_path(model: Qwen35Model, backend: str) -> dict[str, Any]:
    """Logits of the fast path vs the torch reference path on the same GPU weights (bf16)."""
    if backend == "reference":
        return {"backend": "reference", "checked": False, "note": "no fast backend selected"}
    from ninfer.model.cache import KVPool, StatePool, make_batch

    cfg = model.config
    ids = list(random_prompt(300, 3, cfg.vocab_size))
    out = {}
    for b in ("reference", backend):
        model.set_ops(get_ops("cuda", b))
        kv = KVPool.for_config(cfg, 8, torch.bfloat16, "cuda")
        st = StatePool.for_config(cfg, 2, torch.bfloat16, "cuda")
        with torch.inference_mode():
            batch = make_batch([ids], [0], [0], [list(range(5))], 8, "cuda")
            h = model(batch, kv, st)
            out[b] = model.logits(h[0, -1])
    model.set_ops(get_ops("cuda", backend))
    ref, fast = out["reference"], out[backend]
    rel = ((fast - ref).norm() / ref.norm()).item()
    return {"backend": backend, "checked": True, "rel_err_last_logits": rel, "ok": rel < 2e-2}


def bench_model(name: str, args: argparse.Namespace, bw_TBps: float, peak_TFLOPs: float) -> dict[str, Any]:
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model = build_model(name, args.backend)
    log(f"{name}: built in {time.perf_counter() - t0:.1f}s, {torch.cuda.memory_allocated() / GiB:.1f} GiB")
    res: dict[str, Any] = {"fast_path": check_fast_path(model, args.backend)}
    cfg = model.config
    ctx = 4096
    wb = weight_bytes_per_token(model)
    sb = state_bytes_per_token(cfg, ctx)
    res["roofline_bytes_per_step_bs1"] = wb + sb
    res["roofline_decode_tok_s_bs1"] = bw_TBps * 1e12 / (wb + sb)

    ttft_lens = [512, 4096] if args.quick else [512, 4096, 16384]
    eng = make_engine(model, max_context=max(ttft_lens) + 64, lanes=1, chunk=args.prefill_chunk)
    run_requests(eng, [random_prompt(256, 99, cfg.vocab_size)], 4)  # warm-up
    res["ttft_ms"] = {}
    for n in ttft_lens:
        r = run_requests(eng, [random_prompt(n, n, cfg.vocab_size)], 1)
        res["ttft_ms"][str(n)] = r["ttft_s"] * 1e3
        log(f"{name}: ttft {n} = {r['ttft_s'] * 1e3:.1f} ms")
    n8k = 8192
    eng.shutdown(5)
    eng = make_engine(model, max_context=n8k + 64, lanes=1, chunk=args.prefill_chunk)
    r = run_requests(eng, [random_prompt(n8k, 8, cfg.vocab_size)], 1)
    res["prefill_tok_s_8k"] = n8k / r["ttft_s"]
    res["prefill_mfu_8k"] = (
        res["prefill_tok_s_8k"] * prefill_flops_per_token(model, n8k) / (peak_TFLOPs * 1e12)
    )
    log(f"{name}: prefill 8k {res['prefill_tok_s_8k']:.0f} tok/s, MFU {res['prefill_mfu_8k']:.3f}")
    eng.shutdown(5)

    res["decode_tok_s"] = {}
    batches = [1, 8] if args.quick else [1, 2, 4, 8]
    eng = make_engine(
        model, max_context=ctx + args.decode_tokens + 64, lanes=max(batches), chunk=args.prefill_chunk
    )
    for bs in batches:
        prompts = [random_prompt(ctx, 1000 * bs + i, cfg.vocab_size) for i in range(bs)]
        r = run_requests(eng, prompts, args.decode_tokens)
        res["decode_tok_s"][str(bs)] = r["decode_tok_s"]
        log(f"{name}: decode bs={bs} at {ctx} ctx = {r['decode_tok_s']:.1f} tok/s")
    eng.shutdown(5)
    res["int8_kv"] = {"status": "not measured: kv_dtype=int8 is not wired into the engine yet"}
    res["peak_mem_GiB"] = torch.cuda.max_memory_allocated() / GiB
    if not args.no_hf:
        try:
            res["hf_decode_tok_s_bs1"] = hf_decode_tok_s(model, name, 512, args.hf_tokens)
            res["hf_context"] = 512
            log(f"{name}: HF generate bs1 = {res['hf_decode_tok_s_bs1']:.2f} tok/s")
        except Exception as exc:  # the baseline must not hide our own numbers
            res["hf_decode_tok_s_bs1"] = None
            res["hf_error"] = f"{type(exc).__name__}: {exc}"[:500]
            log(f"{name}: HF baseline failed: {res['hf_error']}")
    res["roofline_fraction_bs1"] = res["decode_tok_s"]["1"] / res["roofline_decode_tok_s_bs1"]
    del model
    torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "ops/bench/results"))
    ap.add_argument("--models", default="qwen3.6-27b,qwen3.6-35b-a3b")
    ap.add_argument("--backend", default="reference", help=f"kernel backend: {backends()}")
    ap.add_argument("--prefill-chunk", type=int, default=8192)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--hf-tokens", type=int, default=16)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer sizes (512/4k TTFT, batch 1 and 8)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ops/bench/run.py needs a CUDA device")
    import triton

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip() or os.environ.get("NINFER_COMMIT", "unknown")
    result: dict[str, Any] = {
        "commit": commit,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "command": " ".join(["python", "ops/bench/run.py", *sys.argv[1:]]),
    }
    result["copy_bandwidth_TBps"] = copy_bandwidth_TBps()
    result["matmul_bf16_TFLOPs"] = matmul_peak_TFLOPs()
    log(f"copy {result['copy_bandwidth_TBps']:.2f} TB/s, matmul {result['matmul_bf16_TFLOPs']:.0f} TFLOP/s")
    result["models"] = {}
    for name in args.models.split(","):
        result["models"][name] = bench_model(
            name, args, result["copy_bandwidth_TBps"], result["matmul_bf16_TFLOPs"]
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{dt.date.today().isoformat()}-{commit}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {path}")
    print(f"{'model':18} {'bs1':>8} {'bs8':>8} {'roof1':>8} {'hf1':>7} {'ttft4k':>8} {'pf8k':>8} {'mfu':>6}")
    for name, r in result["models"].items():
        d = r["decode_tok_s"]
        hf = r.get("hf_decode_tok_s_bs1") or float("nan")
        print(
            f"{name:18} {d.get('1', 0):8.1f} {d.get('8', 0):8.1f} {r['roofline_decode_tok_s_bs1']:8.1f} "
            f"{hf:7.2f} {r['ttft_ms'].get('4096', 0):8.1f} {r['prefill_tok_s_8k']:8.0f} {r['prefill_mfu_8k']:6.3f}"
        )


if __name__ == "__main__":
    main()
