"""GPU micro-benchmark of the quantized GEMV (`qgemv`) over the decode projections of the 27B
`groupwise-int` and `fp8` profiles and the 35B-A3B's W8 ones, with a sweep of launch configs.

Each (projection, M, config) is timed as one CUDA graph of back-to-back calls cycling through
distinct copies of the weight totalling more than 1 GB (the L2 cannot serve them). Reports µs per
call, GB/s of the format's bytes (codes + scales), the fraction of the copy bandwidth, the error
against the fp32 product on the dequantized weight, the best config per (projection, M), and per-step
totals of the best configs (what the decode step's projections cost). Also: the large-M path
(dequantize into the scratch + F.linear) against bf16 F.linear at a prefill chunk's M, and the
bf16 GEMV at the same shapes for reference. `--smoke` runs tiny shapes through the interpreter.

    python ops/bench/qgemv_micro.py --out DIR [--smoke] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are imported

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ninfer.formats.registry import format_of  # noqa: E402
from ninfer.formats.weight import QuantWeight  # noqa: E402
from ops.bench.report import provenance  # noqa: E402

COPY_TBPS = 4.25  # measured H200 copy bandwidth (read + write bytes / time)
MIN_CALLS = 50
L2_DEFEAT_BYTES = 1 << 30
MAX_COPIES = 400


@dataclass(frozen=True)
class QProj:
    """One quantized projection [n, k] in `fmt`, used `count` times per decode step of `model`."""

    model: str
    name: str
    fmt: str
    n: int
    k: int
    count: int


def projections(smoke: bool) -> list[QProj]:
    """The 27B groupwise-int step (its fused runs), the 27B fp8 step and the 35B-A3B's W8 runs."""
    if smoke:
        return [QProj("smoke", "a", "q4_g64", 96, 200, 1), QProj("smoke", "b", "q5_g64", 64, 256, 1),
                QProj("smoke", "c", "q8_g32", 40, 96, 1), QProj("smoke", "d", "fp8_e4m3_b128", 72, 200, 1)]  # fmt: skip
    g = "qwen3.6-27b/groupwise-int"
    f = "qwen3.6-27b/fp8"
    m = "qwen3.6-35b-a3b/groupwise-int"
    return [
        QProj(g, "attn [query|key]", "q4_g64", 7168, 5120, 16),
        QProj(g, "attn [gate|value]", "q5_g64", 7168, 5120, 16),
        QProj(g, "attn output", "q5_g64", 5120, 6144, 16),
        QProj(g, "gdn [q|k]", "q4_g64", 4096, 5120, 48),
        QProj(g, "gdn [v|z]", "q5_g64", 12288, 5120, 48),
        QProj(g, "gdn output", "q5_g64", 5120, 6144, 48),
        QProj(g, "mlp [gate|up]", "q4_g64", 34816, 5120, 64),
        QProj(g, "mlp down", "q5_g64", 5120, 17408, 64),
        QProj(g, "lm_head", "q6_g64", 248320, 5120, 1),
        QProj(f, "attn q|k|v", "fp8_e4m3_b128", 14336, 5120, 16),
        QProj(f, "attn output", "fp8_e4m3_b128", 5120, 6144, 16),
        QProj(f, "gdn qkv|z", "fp8_e4m3_b128", 16384, 5120, 48),
        QProj(f, "gdn output", "fp8_e4m3_b128", 5120, 6144, 48),
        QProj(f, "mlp [gate|up]", "fp8_e4m3_b128", 34816, 5120, 64),
        QProj(f, "mlp down", "fp8_e4m3_b128", 5120, 17408, 64),
        QProj(f, "lm_head", "fp8_e4m3_b128", 248320, 5120, 1),
        QProj(m, "attn q|k|gate|v", "q8_g32", 9216, 2048, 10),
        QProj(m, "gdn qkv|z", "q8_g32", 12288, 2048, 30),
        QProj(m, "output (attn, gdn)", "q8_g32", 2048, 4096, 40),
        QProj(m, "shared gate|up", "q8_g32", 1024, 2048, 40),
        QProj(m, "shared down", "q8_g32", 2048, 512, 40),
        QProj(m, "lm_head", "q6_g64", 248320, 2048, 1),
    ]


def lanes_candidates() -> list[Any]:
    """`qgemv_lanes` (one row, groupwise formats): rows a thread x warps, 128 words a row an iteration."""
    from ninfer.kernels.triton.qgemv import QGemvConfig

    return [
        QGemvConfig(1, rows * warps, 0, warps, 1, False, True, 1, False, words=128, thread_rows=rows)
        for rows, warps in ((4, 4), (2, 4), (4, 8), (2, 8), (8, 4))
    ]


def mma_candidates() -> list[Any]:
    """`qgemv_mma` (Q4 / Q5 / Q6, up to 8 rows): 16-row tiles a warp x warps x groups a loop; block_n is
    what the Triton tensor-core kernel would use for more than 8 rows (its fallback)."""
    from ninfer.kernels.triton.qgemv import QGemvConfig

    return [
        QGemvConfig(16, min(128, 16 * tiles * warps), 0, warps, 1, True, True, gps, False, mma_tiles=tiles)
        for tiles, warps, gps in ((2, 4, 2), (2, 4, 1), (1, 4, 2), (1, 8, 2), (4, 4, 1), (2, 8, 4), (2, 4, 4), (1, 4, 4), (2, 4, 8), (1, 8, 4))
    ]


def candidates(m: int, quick: bool, fmt: str, table_cfg: Any = None, against_table: bool = False) -> list[Any]:
    """Configs swept at M rows: block_n, stages, use_dot, groups per iteration, lane layout."""
    from ninfer.kernels.triton.qgemv import QGemvConfig

    mma = mma_candidates() if m <= 8 and fmt in ("q4_g64", "q5_g64", "q6_g64") else []
    if against_table and table_cfg is not None:  # the table's config, and the Gluon kernels where they apply
        return [table_cfg] + (lanes_candidates() if m == 1 and fmt != "fp8_e4m3_b128" else []) + mma

    fp8 = fmt == "fp8_e4m3_b128"
    gpss = (1, 2) if fp8 else (2, 4, 8)
    parities = (False,) if fp8 or fmt == "q8_g32" else (False, True)
    out = []
    if m <= 2:  # one row: the two-dimensional row kernel (CUDA cores) or the tensor cores
        for par in parities:
            for bn in (32, 64):
                for gps in gpss[-2:]:
                    out.append(QGemvConfig(max(1, m), bn, 0, 4, 3, False, True, gps, par))
            out.append(QGemvConfig(16, 64, 0, 4, 3, True, True, gpss[0], par))
        # the word kernel (`qgemv_words`): words of a row per iteration, tile rows, warps, stages
        if m == 1 and not fp8:
            for words, bn, warps, stages in ((128, 16, 4, 2), (128, 16, 4, 3), (128, 8, 4, 2), (128, 8, 4, 3),
                                             (128, 16, 8, 2), (128, 16, 8, 3), (128, 32, 8, 2), (64, 32, 4, 2)):  # fmt: skip
                out.append(QGemvConfig(1, bn, 0, warps, stages, False, True, 1, False, words=words))
            out += lanes_candidates()  # the same words through `qgemv_lanes` (explicit layouts)
    else:
        bm = 16 if m <= 16 else 32
        for par in parities:
            for bn in (64, 128):
                for gps in gpss[:2]:
                    out.append(QGemvConfig(bm, bn, 0, 4, 3, True, True, gps, par))
    return out[:4] if quick else out + mma


def with_split(cfg: Any, n: int, groups: int) -> Any:
    """The config with its K split chosen as the heuristic does (about 4 programs per SM)."""
    import dataclasses

    import triton

    from ninfer.kernels.triton.gemv import NUM_SMS

    n_blocks = triton.cdiv(n, 16 * cfg.mma_tiles * cfg.num_warps if cfg.mma_tiles else cfg.block_n)
    target = 4 * NUM_SMS
    split = 1 if n_blocks >= target else max(1, min(triton.cdiv(target, n_blocks), groups // 4, 32))
    return dataclasses.replace(cfg, split=split)


def _weights(p: QProj, device: str, copies: int) -> list[QuantWeight]:
    """`copies` random weights of the format, drawn as planes directly (values do not matter)."""
    from ninfer.artifact.synth_draw import draw_tensor
    from ninfer.formats.registry import plane_shapes
    from ninfer.formats.weight import from_planes

    fmt = format_of(p.fmt)
    tags = {
        "groupwise": {"base": "U8", "high": "U8", "scale": "F16"},
        "fp8": {"base": "F8_E4M3", "scale": "F32"},
    }
    out = []
    for c in range(copies):
        planes = {
            plane: draw_tensor(
                f"{p.name}.{c}#{plane}", shape, tags[fmt.kind][plane], c, device, fmt.name == "q8_g32"
            )
            for plane, shape in plane_shapes((p.n, p.k), fmt).items()
        }
        out.append(from_planes(fmt, (p.n, p.k), planes))
    return out


def _time(fn: Any, x: torch.Tensor, weights: list[Any], calls: int, cuda: bool, reps: int = 5) -> float:
    """Median µs per call (CUDA: one graph of `calls` calls cycling through `weights`)."""
    for w in weights[:2]:
        fn(x, w)
    if not cuda:
        t0 = time.perf_counter()
        for i in range(calls):
            fn(x, weights[i % len(weights)])
        return (time.perf_counter() - t0) * 1e6 / calls
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


def bench(
    p: QProj, rows: tuple[int, ...], device: str, smoke: bool, quick: bool, against_table: bool = False
) -> list[dict[str, Any]]:
    from ninfer.kernels.triton import qgemv

    cuda = device == "cuda"
    probe = _weights(p, device, 1)[0]
    nbytes = probe.nbytes
    copies = 2 if smoke else min(MAX_COPIES, max(1, -(-L2_DEFEAT_BYTES // nbytes)))
    weights = _weights(p, device, copies)
    calls = 2 if smoke else max(MIN_CALLS, copies)
    groups = weights[0].scale.shape[1]
    out = []
    gen = torch.Generator(device=device).manual_seed(p.n)
    for m in rows:
        x = torch.randn(m, p.k, device=device, generator=gen).to(torch.bfloat16)
        ref = x.float() @ weights[0].dequantize(torch.float32).T
        entry = qgemv._table().get(qgemv.table_key(p.fmt, p.n, p.k, m))
        table_cfg = qgemv.QGemvConfig(**entry) if entry is not None else None
        swept = []
        for cfg in candidates(m, quick or smoke, p.fmt, table_cfg, against_table):
            if cfg is table_cfg:
                swept.append(cfg)
                continue
            cfg = with_split(cfg, p.n, groups)
            swept.append(cfg)
            if cfg.mma_tiles and not smoke:  # the split is a run-time argument: its neighbours cost no compile
                swept += [dataclasses.replace(cfg, split=v) for v in {max(1, cfg.split // 2), 2 * cfg.split} - {cfg.split}]
        for cfg in swept:
            try:
                y = qgemv.qgemv(x, weights[0], cfg)
                err = float((y.float() - ref).abs().max() / ref.abs().max())
                us = _time(lambda a, w, c=cfg: qgemv.qgemv(a, w, c), x, weights, calls, cuda)
            except Exception as exc:  # a config the compiler refuses: recorded, not fatal
                out.append(
                    dict(
                        model=p.model,
                        name=p.name,
                        m=m,
                        config=asdict(cfg),
                        error=f"{type(exc).__name__}: {exc}"[:300],
                    )
                )
                continue
            out.append(dict(
                model=p.model, name=p.name, fmt=p.fmt, n=p.n, k=p.k, m=m, count=p.count, config=asdict(cfg),
                us=us, MB=nbytes / 1e6, GBps=nbytes / us / 1e3, frac_copy_bw=nbytes / us / 1e6 / COPY_TBPS,
                max_rel_err=err, l2_defeated=copies * nbytes >= L2_DEFEAT_BYTES,
            ))  # fmt: skip
    del weights
    if cuda:
        torch.cuda.empty_cache()
    return out


def bf16_reference(p: QProj, rows: tuple[int, ...], device: str) -> list[dict[str, Any]]:
    """The bf16 GEMV (`Ops.linear`'s kernel) at the same shape: what the quantized one replaces."""
    from ninfer.kernels.triton.library import linear

    nbytes = p.n * p.k * 2
    copies = min(MAX_COPIES, max(1, -(-L2_DEFEAT_BYTES // nbytes)))
    gen = torch.Generator(device=device).manual_seed(1)
    weights = [
        torch.randn(p.n, p.k, device=device, dtype=torch.bfloat16, generator=gen) for _ in range(copies)
    ]
    out = []
    for m in rows:
        x = torch.randn(m, p.k, device=device, dtype=torch.bfloat16, generator=gen)
        us = _time(linear, x, weights, max(MIN_CALLS, copies), True)
        out.append(dict(model=p.model, name=p.name, n=p.n, k=p.k, m=m, us=us, GBps=nbytes / us / 1e3))
    del weights
    torch.cuda.empty_cache()
    return out


def prefill_path(device: str, smoke: bool) -> list[dict[str, Any]]:
    """M rows of a prefill chunk: dequantize + F.linear against bf16 F.linear (27B gate|up, down)."""
    from ninfer.kernels.triton.library import qlinear

    shapes = [("mlp [gate|up]", "q4_g64", 34816, 5120), ("mlp down", "q5_g64", 5120, 17408)]
    ms = (512, 2048, 8192)
    if smoke:
        shapes, ms = [("a", "q4_g64", 96, 128)], (70,)
    out = []
    for name, fmt, n, k in shapes:
        w = _weights(QProj("prefill", name, fmt, n, k, 1), device, 1)[0]
        dense = w.dequantize(torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            q_us = _time(qlinear, x, [w], 5 if not smoke else 1, device == "cuda")
            d_us = _time(torch.nn.functional.linear, x, [dense], 5 if not smoke else 1, device == "cuda")
            out.append(
                dict(name=name, fmt=fmt, n=n, k=k, m=m, quant_us=q_us, bf16_us=d_us, ratio=d_us / q_us)
            )
        del w, dense
    return out


MAX_REL_ERR = 2e-2  # a config whose result is further than this from the dequantized product never wins


def best_by_shape(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in rows:
        if "us" not in r or not r["max_rel_err"] <= MAX_REL_ERR:
            continue
        key = (r["model"], r["name"], r["m"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    return list(best.values())


def step_totals(best: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """ms of one decode step's projections per (model, M), best config each."""
    out: dict[str, dict[str, float]] = {}
    for r in best:
        t = out.setdefault(r["model"], {})
        t[str(r["m"])] = t.get(str(r["m"]), 0.0) + r["count"] * r["us"] / 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--quick", action="store_true", help="four configs per M")
    ap.add_argument("--rows", default="1,8", help="M values, comma list")
    ap.add_argument(
        "--table", type=Path, default=None, help="write the best configs here (qgemv_configs.json)"
    )
    ap.add_argument(
        "--against-table", action="store_true",
        help="one row only: each shape's table config against the qgemv_lanes candidates (few compiles)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.smoke:
        from ninfer.kernels.triton.interpreter_fixes import patch_interpreter

        patch_interpreter()
        device = "cpu"
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --smoke for the CPU interpreter check")
    else:
        device = "cuda"
    rows_m = (1, 3) if args.smoke else tuple(int(v) for v in args.rows.split(","))
    t0 = time.perf_counter()
    result: dict[str, Any] = provenance("ops/bench/qgemv_micro.py", sys.argv[1:])
    result.update(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", smoke=args.smoke,
                  copy_TBps=COPY_TBPS, rows=[], bf16=[])  # fmt: skip
    for p in projections(args.smoke):
        result["rows"] += bench(p, rows_m, device, args.smoke, args.quick, args.against_table)
        if device == "cuda" and p.model.endswith("groupwise-int") and p.model.startswith("qwen3.6-27b"):
            result["bf16"] += bf16_reference(p, rows_m, device)
        print(f"{p.model} {p.name}: done ({time.perf_counter() - t0:.0f}s)", flush=True)
    result["best"] = best_by_shape(result["rows"])
    if args.table is not None:  # the measured configs, as `qgemv.pick_config` reads them
        from ninfer.kernels.triton.qgemv import _table, table_key

        # shapes and row counts this run did not measure keep the table's entries
        configs = {**_table(), **{table_key(r["fmt"], r["n"], r["k"], r["m"]): r["config"] for r in result["best"]}}
        table = {
            k: v
            for k, v in provenance("ops/bench/qgemv_micro.py", sys.argv[1:]).items()
            if k in ("commit", "date", "gpu")
        }
        args.table.write_text(json.dumps({**table, "configs": configs}, indent=1, sort_keys=True) + "\n")
    result["step_ms"] = step_totals(result["best"])
    result["prefill"] = prefill_path(device, args.smoke)
    result["wall_s"] = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "qgemv_micro.json").write_text(json.dumps(result, indent=1))
    for r in sorted(result["best"], key=lambda r: (r["model"], r["name"], r["m"])):
        c = r["config"]
        print(f"{r['model'][:26]:26} {r['name'][:20]:20} M={r['m']} {r['us']:8.1f} us {r['GBps']:6.0f} GB/s "
              f"{r['frac_copy_bw']:.2f} bn{c['block_n']} w{c['num_warps']} s{c['num_stages']} split{c['split']} "
              f"gps{c['gps']} dot{int(c['use_dot'])} err {r['max_rel_err']:.1e}")  # fmt: skip
    print("step ms:", json.dumps(result["step_ms"]))
    for r in result["prefill"]:
        print(
            f"prefill {r['name']} M={r['m']}: quant {r['quant_us']:.0f} us, bf16 {r['bf16_us']:.0f} us ({r['ratio']:.2f})"
        )
    print(f"wall {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
