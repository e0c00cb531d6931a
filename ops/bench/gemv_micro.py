"""GPU micro-benchmark of the Triton decode GEMV against torch.nn.functional.linear.

For the 27B and 35B-A3B decode projections (separate and merged weights) at M = 1, 2, 4, 8 rows,
each implementation is timed as one CUDA graph of back-to-back calls (at least 50) that cycle
through distinct copies of the weight totalling more than 1 GB, so the L2 cache cannot serve
them. Reports µs per call, GB/s of weight bytes, the fraction of the copy bandwidth, the speedup,
the largest error against an fp32 product, and per-step totals (sum over one decode step's
projections). `--smoke` runs tiny shapes on the CPU through the Triton interpreter (wall clock).

    python ops/bench/gemv_micro.py --out DIR [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are imported

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ninfer.kernels.triton import gemv  # noqa: E402
from ninfer.model.config import TextConfig  # noqa: E402
from ops.bench.report import provenance  # noqa: E402
from ops.bench.shapes import SHAPES, SMOKE_SHAPES  # noqa: E402

COPY_TBPS = 4.25  # measured H200 copy bandwidth (read + write bytes / time)
ROWS = (1, 2, 4, 8)
MIN_CALLS = 50
L2_DEFEAT_BYTES = 1 << 30
MAX_COPIES = 400  # weights under 2.7 MB cannot defeat the L2 at this count: marked l2_defeated=False


@dataclass(frozen=True)
class Proj:
    """One projection weight [n, k], used `count` times per decode step, in the `variants` given."""

    name: str
    n: int
    k: int
    count: int
    variants: tuple[str, ...]  # "separate", "merged" or both


def projections(cfg: TextConfig) -> list[Proj]:
    """The projections of one decode step of `cfg` (MoE routed experts excluded: not `linear`)."""
    h, nl, na = cfg.hidden_size, len(cfg.linear_layers), len(cfg.attention_layers)
    both, sep, mer = ("separate", "merged"), ("separate",), ("merged",)
    kv = cfg.num_key_value_heads * cfg.head_dim
    nv = cfg.linear_num_value_heads
    out = [
        Proj("gdn.in_proj_qkv", 2 * cfg.key_dim + cfg.value_dim, h, nl, sep),
        Proj("gdn.in_proj_z", cfg.value_dim, h, nl, sep),
        Proj("gdn.in_proj_b", nv, h, nl, sep),
        Proj("gdn.in_proj_a", nv, h, nl, sep),
        Proj("gdn.in_proj_qkvzba", 2 * cfg.key_dim + 2 * cfg.value_dim + 2 * nv, h, nl, mer),
        Proj("gdn.out_proj", h, cfg.value_dim, nl, both),
        Proj("attn.q_proj(+gate)", 2 * cfg.num_attention_heads * cfg.head_dim, h, na, sep),
        Proj("attn.k_proj", kv, h, na, sep),
        Proj("attn.v_proj", kv, h, na, sep),
        Proj("attn.qkv", 2 * cfg.num_attention_heads * cfg.head_dim + 2 * kv, h, na, mer),
        Proj("attn.o_proj", h, cfg.num_attention_heads * cfg.head_dim, na, both),
    ]
    layers = cfg.num_hidden_layers
    if cfg.num_experts:
        se = cfg.shared_expert_intermediate_size or 0
        out += [
            Proj("moe.router", cfg.num_experts, h, layers, sep),
            Proj("moe.shared_expert_gate", 1, h, layers, sep),
            Proj("moe.router|shared_gate", cfg.num_experts + 1, h, layers, mer),
            Proj("shared.gate_proj", se, h, layers, sep),
            Proj("shared.up_proj", se, h, layers, sep),
            Proj("shared.gate_up", 2 * se, h, layers, mer),
            Proj("shared.down_proj", h, se, layers, both),
        ]
    else:
        inter = cfg.intermediate_size or 0
        out += [
            Proj("mlp.gate_proj", inter, h, layers, sep),
            Proj("mlp.up_proj", inter, h, layers, sep),
            Proj("mlp.gate_up", 2 * inter, h, layers, mer),
            Proj("mlp.down_proj", h, inter, layers, both),
        ]
    out.append(Proj("lm_head", cfg.vocab_size, h, 1, both))
    return out


def _time_cuda(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor,
               weights: list[torch.Tensor], calls: int, reps: int = 5) -> float:  # fmt: skip
    """Median µs per call of one CUDA graph of `calls` calls cycling through `weights`."""
    for w in weights[:2]:
        fn(x, w)  # JIT and cuBLAS heuristics outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(x, weights[i % len(weights)])
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def _time_cpu(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor,
              weights: list[torch.Tensor], calls: int, reps: int = 1) -> float:  # fmt: skip
    fn(x, weights[0])
    start = time.perf_counter()
    for i in range(calls):
        fn(x, weights[i % len(weights)])
    return (time.perf_counter() - start) * 1e6 / calls


def bench_projection(p: Proj, rows: tuple[int, ...], device: str, dtype: torch.dtype, smoke: bool,
                     ours: Callable[..., torch.Tensor]) -> list[dict[str, Any]]:  # fmt: skip
    """Rows of the result table for one projection shape."""
    gen = torch.Generator(device=device).manual_seed(p.n * 31 + p.k)
    nbytes = p.n * p.k * torch.finfo(dtype).bits // 8
    copies = 2 if smoke else min(MAX_COPIES, max(1, -(-L2_DEFEAT_BYTES // nbytes)))
    calls = 2 if smoke else max(MIN_CALLS, copies)
    weights = [torch.randn(p.n, p.k, device=device, dtype=dtype, generator=gen) * 0.02 for _ in range(copies)]
    timer = _time_cpu if smoke else _time_cuda
    out = []
    for m in rows:
        x = torch.randn(m, p.k, device=device, dtype=dtype, generator=gen)
        ref = (x.float() @ weights[0].float().T).float()
        err = ((ours(x, weights[0]).float() - ref).abs().max() / ref.abs().max()).item()
        t_ours = timer(ours, x, weights, calls)
        t_torch = timer(torch.nn.functional.linear, x, weights, calls)
        out.append(dict(
            name=p.name, n=p.n, k=p.k, m=m, count=p.count, variants=list(p.variants),
            weight_MB=nbytes / 1e6, copies=copies, calls=calls,
            l2_defeated=copies * nbytes >= L2_DEFEAT_BYTES, linear_uses_gemv=gemv.use_gemv(x, weights[0]),
            ours_us=t_ours, torch_us=t_torch,
            ours_GBps=nbytes / t_ours / 1e3, torch_GBps=nbytes / t_torch / 1e3,
            ours_frac_copy_bw=nbytes / t_ours / 1e6 / COPY_TBPS,
            torch_frac_copy_bw=nbytes / t_torch / 1e6 / COPY_TBPS,
            speedup=t_torch / t_ours, max_rel_err=err,
            linear_us=t_ours if gemv.use_gemv(x, weights[0]) else t_torch,
        ))  # fmt: skip
    del weights
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def step_totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per variant and M: µs of one decode step's projections (sum of count x µs): the GEMV kernel
    everywhere (ours), F.linear everywhere (torch), and `Ops.linear`'s per-shape choice (linear)."""
    totals: dict[str, dict[str, dict[str, float]]] = {}
    for variant in ("separate", "merged"):
        per_m: dict[str, dict[str, float]] = {}
        for r in rows:
            if variant in r["variants"]:
                t = per_m.setdefault(str(r["m"]), {"ours_us": 0.0, "torch_us": 0.0, "linear_us": 0.0})
                for key in t:
                    t[key] += r["count"] * r[key]
        for t in per_m.values():
            t["speedup"] = t["torch_us"] / t["ours_us"]
            t["linear_speedup"] = t["torch_us"] / t["linear_us"]
        totals[variant] = per_m
    return totals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for gemv_micro.json")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    args = ap.parse_args(argv)
    if args.smoke:
        from ninfer.kernels.triton.interpreter_fixes import patch_interpreter

        patch_interpreter()
        device = "cpu"
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --smoke for the CPU interpreter check")
    else:
        device = "cuda"
    from ninfer.kernels.triton.library import gemv_op as ours  # the kernel itself, on every shape

    table = SMOKE_SHAPES if args.smoke else SHAPES
    rows_m = ROWS[:2] if args.smoke else ROWS
    dtype = torch.bfloat16
    t0 = time.perf_counter()
    result: dict[str, Any] = provenance("ops/bench/gemv_micro.py", sys.argv[1:])
    result.update(
        device=torch.cuda.get_device_name() if device == "cuda" else "cpu", smoke=args.smoke,
        dtype=str(dtype), copy_TBps=COPY_TBPS, models={},
    )  # fmt: skip
    for model, shape in table.items():
        cfg = TextConfig.from_hf(shape)
        projs = projections(cfg)
        rows = [r for p in projs for r in bench_projection(p, rows_m, device, dtype, args.smoke, ours)]
        result["models"][model] = dict(
            projections=[asdict(p) for p in projs], rows=rows, step_totals_us=step_totals(rows)
        )
    result["wall_s"] = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gemv_micro.json").write_text(json.dumps(result, indent=1))
    print_table(result)
    return 0


def print_table(result: dict[str, Any]) -> None:
    hdr = (f"{'projection':24} {'N':>7} {'K':>6} {'M':>2} {'gemv us':>9} {'torch us':>9} {'GB/s':>7} "
           f"{'of bw':>6} {'x':>5} {'err':>8} uses")  # fmt: skip
    for model, res in result["models"].items():
        print(f"\n== {model} ({result['device']}, {result['dtype']})\n{hdr}")
        for r in res["rows"]:
            print(f"{r['name']:24} {r['n']:7d} {r['k']:6d} {r['m']:2d} {r['ours_us']:9.2f} {r['torch_us']:9.2f} "
                  f"{r['ours_GBps']:7.0f} {r['ours_frac_copy_bw']:6.2f} {r['speedup']:5.2f} {r['max_rel_err']:8.1e} {'gemv' if r['linear_uses_gemv'] else 'torch'}")  # fmt: skip
        for variant, per_m in res["step_totals_us"].items():
            cells = "  ".join(
                f"M={m}: gemv {t['ours_us'] / 1e3:.3f} / torch {t['torch_us'] / 1e3:.3f} / linear "
                f"{t['linear_us'] / 1e3:.3f} ms ({t['speedup']:.2f}x, {t['linear_speedup']:.2f}x)"
                for m, t in per_m.items()
            )
            print(f"step total, {variant:8} weights: {cells}")
    print(f"\nwall {result['wall_s']:.1f} s")


if __name__ == "__main__":
    raise SystemExit(main())
