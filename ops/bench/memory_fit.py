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

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ninfer.artifact import open_artifact  # noqa: E402
from ninfer.artifact.synth import synth  # noqa: E402
from ninfer.bootstrap import build_engine  # noqa: E402
from ninfer.config.loader import load_settings  # noqa: E402
from ninfer.service.cli import translate  # noqa: E402
from ops.bench.report import provenance  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1 :] if "--" in argv else ["--max-context", "16384", "--max-concurrency", "2"]
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3.6-27b")
    ap.add_argument("--weights", default="groupwise-int")
    ap.add_argument("--layers", type=int, default=None, help="first N layers only (a smoke run)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(own)
    res = provenance("ops/bench/memory_fit.py", sys.argv[1:])
    res.update(shape=args.shape, weights=args.weights, flags=flags)
    with tempfile.TemporaryDirectory() as tmp:
        art = open_artifact(synth(Path(tmp) / "m.ninfer", args.shape, layers=args.layers, mtp=False, weights=args.weights))
        settings = load_settings(translate([str(art.path), *flags]))
        t0 = time.perf_counter()
        eng = build_engine(settings, art).start()
        ok = eng.wait_ready(timeout=900)
        res["ready_s"] = time.perf_counter() - t0
        res["ready"] = ok and eng.error is None
        res["error"] = None if eng.error is None else repr(eng.error)[:500]
        res["weight_bytes"] = eng.model.weight_bytes()
        res["ledger"] = {k: v for k, v in vars(eng.ledger).items() if isinstance(v, (int, float, str))}
        if torch.cuda.is_available():
            res["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
            res["reserved_gpu_bytes"] = torch.cuda.memory_reserved()
            res["fits_24GB"] = res["peak_gpu_bytes"] <= 24e9
        eng.shutdown(5)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"{res['date'][:10]}-{res['commit']}-memory-{args.shape}-{args.weights}.json"
    (args.out / name).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res.get(k) for k in ("ready", "ready_s", "weight_bytes", "peak_gpu_bytes", "fits_24GB", "error")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
