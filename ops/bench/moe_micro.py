"""MoE decode expert kernels at the 35B-A3B shapes: µs per layer and GB/s over the distinct experts' bytes.

Usage (from the repository root):

    python ops/bench/moe_micro.py --out DIR            # H200: CUDA graphs of 40 layers, ~1 min
    python ops/bench/moe_micro.py --out DIR --smoke    # tiny shapes on the CPU Triton interpreter

For each token count (random top-8 of 256 routing per layer) every candidate is captured as one
CUDA graph of `--layers` back-to-back MoE layers that cycle over `--copies` distinct weight sets
(> 1 GB in all, so L2 cannot serve a later layer), replayed and timed with CUDA events. Bytes per
layer count each distinct routed expert once (gate_up + down); the fraction is of the measured
copy bandwidth (`--bw-tbps`, 4.25 TB/s read+write on the H200). Candidates: `small` (the Triton
`moe_experts_small`), `grouped` (sort + `torch._grouped_mm`), any `--extra name=file.py:function`
with the same contract, and `--sweep` launch shapes of `small`. Writes DIR/moe_micro.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from ops.bench.report import provenance  # noqa: E402 (stdlib-only module: safe before the interpreter switch)

Fn = Callable[..., "torch.Tensor"]  # noqa: F821 (torch is imported after the interpreter switch)
SHAPES = {"full": dict(e=256, k=8, h=2048, ie=512), "smoke": dict(e=8, k=2, h=64, ie=32)}
# --sweep: one kernel's launch shape at a time, the other at the heuristic's choice; per kernel
# (block_n, block_k, warps, stages)
SWEEP_GATE_UP = [
    (bn, bk, w, st) for bn in (32, 64, 128) for bk in (128, 256) for w in (4, 8) for st in (3, 5)
]
SWEEP_DOWN = [
    (bn, bk, w, st) for bn in (64, 128, 256) for bk in (64, 128, 256) for w in (4, 8) for st in (3, 5)
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, CPU interpreter, eager timing")
    ap.add_argument("--tokens", default=None, help="comma list (default 1,2,4,8; smoke 1,2)")
    ap.add_argument("--layers", type=int, default=None, help="layers per graph (default 40; smoke 2)")
    ap.add_argument("--copies", type=int, default=None, help="distinct weight sets (default 8; smoke 2)")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--bw-tbps", type=float, default=4.25)
    ap.add_argument("--extra", action="append", default=[], help="name=path/to/file.py:function")
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="also time `small` over each kernel's block_n/block_k/warps/stages",
    )
    args = ap.parse_args()
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from ninfer.kernels.triton.interpreter_fixes import patch_interpreter

        patch_interpreter()
    res = {**provenance("ops/bench/moe_micro.py", sys.argv[1:]), **run(args)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "moe_micro.json").write_text(json.dumps(res, indent=1))
    print(table(res))


def run(args: argparse.Namespace) -> dict:
    import torch
    import triton

    from ninfer.kernels.moe_grouped import moe_experts_grouped
    from ninfer.kernels.triton import moe

    cuda = not args.smoke
    if cuda and not torch.cuda.is_available():
        raise SystemExit("moe_micro needs a CUDA device (or --smoke for the CPU interpreter)")
    device = "cuda" if cuda else "cpu"
    s = SHAPES["smoke" if args.smoke else "full"]
    tokens = [int(t) for t in (args.tokens or ("1,2" if args.smoke else "1,2,4,8")).split(",")]
    layers = args.layers or (2 if args.smoke else 40)
    copies = args.copies or (2 if args.smoke else 8)
    dtype = torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)
    e, k, h, ie = s["e"], s["k"], s["h"], s["ie"]
    weights = [
        (
            torch.randn(e, 2 * ie, h, device=device, dtype=dtype, generator=gen) * h**-0.5,
            torch.randn(e, h, ie, device=device, dtype=dtype, generator=gen) * ie**-0.5,
        )
        for _ in range(copies)
    ]
    expert_bytes = 3 * ie * h * weights[0][0].element_size()
    cands: dict[str, Fn] = {"small": moe.moe_experts_small}
    if cuda:
        cands["grouped"] = moe_experts_grouped
    for spec in args.extra:
        name, _, target = spec.partition("=")
        cands[name] = _load(target)
    sweeps: dict[str, tuple[str, tuple[int, int, int, int]]] = {}  # candidate -> (kernel, shape)
    if args.sweep:
        sweeps.update({f"small[gate_up bn{bn},bk{bk},w{w},st{st}]": ("gate_up", (bn, bk, w, st))
                       for bn, bk, w, st in SWEEP_GATE_UP})  # fmt: skip
        sweeps.update({f"small[down bn{bn},bk{bk},w{w},st{st}]": ("down", (bn, bk, w, st))
                       for bn, bk, w, st in SWEEP_DOWN})  # fmt: skip
        if args.smoke:  # the interpreter: a few shapes prove the path
            sweeps = dict(list(sweeps.items())[:2] + list(sweeps.items())[-2:])
    out: dict = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "smoke": args.smoke,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shape": dict(s, dtype="bf16", layers=layers, copies=copies),
        "weights_GB": round(copies * e * expert_bytes / 1e9, 2),
        "bw_TBps": args.bw_tbps,
        "results": {},
    }
    for n in tokens:
        x = torch.randn(n, h, device=device, dtype=dtype, generator=gen)
        routes = [_route(n, e, k, device, gen) for _ in range(layers)]
        distinct = [int(torch.unique(idx).numel()) for idx, _ in routes]
        ref_args = (x, *weights[0], *routes[0])
        ref = _moe_ref()(*ref_args).float()
        base = moe.pick_config(n, k, e, h, ie)
        for name, (kernel, (bn, bk, w, st)) in sweeps.items():
            shape = {f"{kernel}_bn": bn, f"{kernel}_bk": bk, f"{kernel}_warps": w, f"{kernel}_stages": st}
            cands[name] = functools.partial(moe.moe_experts_small, config=dataclasses.replace(base, **shape))
        for name, fn in cands.items():
            calls = [(x, *weights[i % copies], *routes[i]) for i in range(layers)]
            try:
                err = (fn(*ref_args).float() - ref).abs().max().item() / ref.abs().max().item()
                sec = _time_graph(calls, fn, args.replays) if cuda else _time_eager(calls, fn)
            except Exception as exc:  # a candidate that cannot run is reported
                out["results"].setdefault(name, {})[str(n)] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                continue
            gbps = sum(distinct) * expert_bytes / sec / 1e9
            out["results"].setdefault(name, {})[str(n)] = {
                "us_per_layer": _sig(sec / layers * 1e6),
                "GBps_distinct": _sig(gbps),
                "frac_of_bw": _sig(gbps / (args.bw_tbps * 1e3)),
                "distinct_experts_mean": _sig(sum(distinct) / layers),
                "rel_err_vs_ref": _sig(err),
            }
    return out


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def _route(n: int, e: int, k: int, device: str, gen) -> tuple:
    import torch

    logits = torch.randn(n, e, device=device, generator=gen)
    w, idx = torch.softmax(logits, -1).topk(k, -1)
    return idx, (w / w.sum(-1, keepdim=True)).to(torch.bfloat16)


def _moe_ref() -> Fn:
    from ninfer.kernels.moe_ref import moe_experts

    return moe_experts


def _load(target: str) -> Fn:
    path, _, fn = target.rpartition(":")
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--extra: cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, fn)


def _time_graph(calls: list[tuple], fn: Fn, replays: int) -> float:
    """Seconds for one pass over all layers: a CUDA graph of every call, replayed."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls[:2]:  # compile and warm up outside the capture
            fn(*c)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            fn(*c)
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / replays


def _time_eager(calls: list[tuple], fn: Fn) -> float:
    fn(*calls[0])
    t0 = time.perf_counter()
    for c in calls:
        fn(*c)
    return time.perf_counter() - t0


def table(res: dict) -> str:
    rows = [f"MoE experts, {res['device']}, {res['shape']} (fraction of {res['bw_TBps']} TB/s)"]
    rows.append(
        f"{'candidate':<28} {'tokens':>6} {'us/layer':>9} {'GB/s':>8} {'frac':>6} {'experts':>8} {'rel err':>9}"
    )
    for name, by_n in res["results"].items():
        for n, r in by_n.items():
            if "error" in r:
                rows.append(f"{name:<28} {n:>6} {r['error']}")
                continue
            rows.append(
                f"{name:<28} {n:>6} {r['us_per_layer']:>9.2f} {r['GBps_distinct']:>8.4g} "
                f"{r['frac_of_bw']:>6.3g} {r['distinct_experts_mean']:>8.2f} {r['rel_err_vs_ref']:>9.2e}"
            )
    return "\n".join(rows)


if __name__ == "__main__":
    main()
