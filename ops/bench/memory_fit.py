"""Whether a server fits a GPU: the engine `ninfer-serve` builds, on a synthetic artifact of a
released shape and weight profile, with the given settings, warmed up and captured (ready), then
`torch.cuda.max_memory_allocated` (and the weight bytes, KV and state sizing). One JSON.

    python ops/bench/memory_fit.py --shape qwen3.6-27b --weights groupwise-int --out DIR \\
        [-- --max-context 16384 --max-concurrency 2]

The issue's target: a 27B groupwise-int server at --max-context 16384 --max-concurrency 2 within 24 GB.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ninfer.artifact import open_artifact  # noqa: E402
from ninfer.artifact.synth import synth  # noqa: E402
from ninfer.bootstrap import build_engine  # noqa: E402
from ninfer.config.loader import load_settings  # noqa: E402
from ninfer.service.cli import translate  # noqa: E402
from ops.bench.report import provenance  # noqa: E402


def peak_live_by_site(snapshot: dict[str, Any], top: int = 40) -> list[dict[str, Any]]:
    """Replay the allocator's trace: the blocks live at the moment of the most bytes, summed by the
    innermost ninfer frame that allocated them (MB, count)."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for trace in snapshot.get("device_traces", []):
        for ev in trace:
            action, addr, size = ev.get("action"), ev.get("addr"), int(ev.get("size", 0))
            if action == "alloc":
                frames = ev.get("frames") or []
                site = next((f"{f['filename'].rsplit('ninfer/', 1)[-1]}:{f['line']} {f['name']}"
                             for f in frames if "/ninfer/" in f.get("filename", "")), "?")  # fmt: skip
                live[addr] = (size, site)
                total += size
                if total > peak:
                    peak, at_peak = total, dict(live)
            elif action in ("free_completed",) and addr in live:
                total -= live.pop(addr)[0]
    sites: dict[str, list[int]] = {}
    for size, site in at_peak.values():
        agg = sites.setdefault(site, [0, 0])
        agg[0] += size
        agg[1] += 1
    rows = sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"site": k, "MB": round(v[0] / 1e6, 1), "count": v[1]} for k, v in rows]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1 :] if "--" in argv else ["--max-context", "16384", "--max-concurrency", "2"]
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3.6-27b")
    ap.add_argument("--weights", default="groupwise-int")
    ap.add_argument("--layers", type=int, default=None, help="first N layers only (a smoke run)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--trace", action="store_true", help="record allocations: the live bytes at the peak, by call site")
    args = ap.parse_args(own)
    res = provenance("ops/bench/memory_fit.py", sys.argv[1:])
    res.update(shape=args.shape, weights=args.weights, flags=flags)
    with tempfile.TemporaryDirectory() as tmp:
        art = open_artifact(synth(Path(tmp) / "m.ninfer", args.shape, layers=args.layers, mtp=False, weights=args.weights))
        settings = load_settings(translate([str(art.path), *flags]))
        cuda = torch.cuda.is_available()
        if cuda and args.trace:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        t0 = time.perf_counter()
        eng = build_engine(settings, art)
        if cuda:  # weights, pools and states resident; what loading peaked at (synthetic draws included)
            res["resident_after_build_bytes"] = torch.cuda.memory_allocated()
            res["peak_build_bytes"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        eng.start()
        ok = eng.wait_ready(timeout=900)
        if cuda:  # warm-up and graph capture on top of what the build left
            res["resident_after_ready_bytes"] = torch.cuda.memory_allocated()
            res["peak_warmup_bytes"] = torch.cuda.max_memory_allocated()
            if args.trace:
                res["peak_live_by_site"] = peak_live_by_site(torch.cuda.memory._snapshot())
                torch.cuda.memory._record_memory_history(enabled=None)
        res["ready_s"] = time.perf_counter() - t0
        res["ready"] = ok and eng.error is None
        res["error"] = None if eng.error is None else repr(eng.error)[:500]
        res["weight_bytes"] = eng.model.weight_bytes()
        res["ledger"] = {k: v for k, v in vars(eng.ledger).items() if isinstance(v, (int, float, str))}
        if cuda:
            res["peak_gpu_bytes"] = max(res["peak_build_bytes"], res["peak_warmup_bytes"])
            res["reserved_gpu_bytes"] = torch.cuda.memory_reserved()
            res["fits_24GB"] = res["peak_gpu_bytes"] <= 24e9
        eng.shutdown(5)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"{res['date'][:10]}-{res['commit']}-memory-{args.shape}-{args.weights}.json"
    (args.out / name).write_text(json.dumps(res, indent=1))
    keys = ("ready", "ready_s", "weight_bytes", "resident_after_build_bytes", "peak_build_bytes",
            "resident_after_ready_bytes", "peak_warmup_bytes", "peak_gpu_bytes", "fits_24GB", "error")  # fmt: skip
    print(json.dumps({k: res.get(k) for k in keys}))
    for row in res.get("peak_live_by_site", [])[:25]:
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
