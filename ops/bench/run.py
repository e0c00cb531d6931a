"""One-call benchmark: builds random-weight models of the released shapes, checks the fast path, times everything.

Usage (from the repository root):

    python ops/bench/run.py --out ops/bench/results [--models qwen3.6-27b,qwen3.6-35b-a3b] [--quick]
        [--backend triton] [--compile MODELS] [--skip eager,ttft,prefill,int8,spec,hf] [--startup MODELS] [--budget-s 540]
        [--spec-ks 3 --spec-acceptance 100 --spec-batches 1]   # narrow the speculative rows
    python ops/bench/run.py --smoke --out /tmp/x     # tiny models on the CPU, every section, seconds

Per model (the released shapes, `ninfer/artifact/released.py`): bf16 weights drawn on the device, the fast
path's logits against the reference path judged by the reference's own noise (`fast_path.py`),
then through the engine (`engine_runs.py`): decode tokens/s at batch 1..8 at 4k context (CUDA
graphs), eager batch 1 with a one-step profile, TTFT at 512 / 4k / 16k, 8k prefill tokens/s and
MFU, speculative rows with the oracle drafter and the MTP draft-step cost (`spec_rows.py`), the HF
`generate` baseline on the same weights (`hf_baseline.py`), against the copy-bandwidth roofline
and matmul peak (`ceilings.py`). Each model runs in its own process; the budget is shared out over
the models (time one leaves goes to the next); sections past it are skipped and listed. Writes
`DATE-COMMIT.json` under --out after every section and prints a table last (`report.py`).
--startup MODELS times a cold and a warm start (fresh processes, one compile cache; `startup.py`).
--smoke runs the same code paths on tiny dense and MoE configs (float32 on the CPU by default).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ninfer.artifact.profiles import PROFILES  # noqa: E402
from ninfer.kernels.dispatch import backends  # noqa: E402
from ninfer.service.compile_cache import setup_compile_cache  # noqa: E402
from ops.bench.ceilings import GiB, copy_bandwidth_TBps, matmul_peak_TFLOPs  # noqa: E402
from ops.bench.engine_runs import EngineSpec  # noqa: E402
from ops.bench.model_run import ModelArgs, Sizes, bench_model, sizes_for  # noqa: E402
from ops.bench.report import provenance, summary_table, write_json  # noqa: E402
from ops.bench.startup import startup_rows  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Budget:
    """Seconds left of `seconds` since construction (the device call has a hard limit)."""

    def __init__(self, seconds: float) -> None:
        self.t0, self.seconds = time.perf_counter(), seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)


def default_backend(device: str) -> str:
    """triton where it runs on `device`, else the reference path."""
    dev_type = torch.device(device).type
    return "triton" if dev_type in backends().get("triton", ()) else "reference"


def model_args(name: str, args: argparse.Namespace) -> ModelArgs:
    return ModelArgs(
        name=name,
        smoke=args.smoke,
        backend=args.backend,
        es=EngineSpec(args.device, args.dtype, args.prefill_chunk),
        sizes=spec_override(sizes_for(args.smoke, args.quick, args.decode_tokens, args.proposal_ids), args),
        decode_tokens=args.decode_tokens,
        hf_tokens=args.hf_tokens,
        skip=tuple(s for s in args.skip.split(",") if s),
        compile=name in args.compile.split(","),
        no_hf=args.no_hf,
        weights=args.weights,
    )


def run_one_model(args: argparse.Namespace) -> None:
    """Child mode (--one-model): one model in this process; results to --child-out after every
    section (a crash or timeout keeps what was measured)."""
    budget = Budget(args.budget_s)
    setup_compile_cache()
    path = Path(args.child_out)
    res: dict[str, Any] = {}
    try:
        bench_model(model_args(args.one_model, args), args.bw_tbps, args.peak_tflops, budget.left,
                    lambda: write_json(path, res), res, log)  # fmt: skip
    except Exception as exc:  # keep what was measured, say what failed
        res["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        log(f"{args.one_model}: FAILED {res['error']}")
    write_json(path, res)


def run_child(name: str, args: argparse.Namespace, bw: float, peak: float, seconds: float) -> dict[str, Any]:
    """Bench `name` in a fresh process (all its device memory is returned when it exits)."""
    import json

    child_out = Path(args.out) / f".child-{name}.json"
    child_out.unlink(missing_ok=True)
    argv = [sys.executable, str(Path(__file__).resolve()), "--one-model", name, "--child-out", str(child_out),
            "--bw-tbps", str(bw), "--peak-tflops", str(peak), "--budget-s", str(seconds),
            "--backend", args.backend, "--device", args.device, "--dtype", args.dtype,
            "--prefill-chunk", str(args.prefill_chunk), "--decode-tokens", str(args.decode_tokens),
            "--hf-tokens", str(args.hf_tokens), "--proposal-ids", str(args.proposal_ids),
            "--compile", args.compile, "--skip", args.skip, "--out", args.out,
            "--weights", args.weights]  # fmt: skip
    argv += [
        "--spec-ks",
        args.spec_ks,
        "--spec-acceptance",
        args.spec_acceptance,
        "--spec-batches",
        args.spec_batches,
    ]
    argv += ["--no-hf"] * args.no_hf + ["--quick"] * args.quick + ["--smoke"] * args.smoke
    try:
        rc: int | str = subprocess.run(argv, cwd=ROOT, timeout=seconds + 120).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    res: dict[str, Any] = json.loads(child_out.read_text()) if child_out.exists() else {}
    child_out.unlink(missing_ok=True)
    if rc != 0 and "error" not in res:
        res["error"] = f"bench process for {name} ended with {rc}"
    return res


def spec_override(sizes: Sizes, args: argparse.Namespace) -> Sizes:
    """The speculative rows narrowed by --spec-ks / --spec-acceptance / --spec-batches."""

    def ints(text: str, default: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(int(v) for v in text.split(",") if v) or default

    spec = dataclasses.replace(
        sizes.spec,
        ks=ints(args.spec_ks, sizes.spec.ks),
        acceptance_pct=ints(args.spec_acceptance, sizes.spec.acceptance_pct),
        batches=ints(args.spec_batches, sizes.spec.batches),
    )
    return dataclasses.replace(sizes, spec=spec)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "ops/bench/results"))
    ap.add_argument("--models", default="qwen3.6-27b,qwen3.6-35b-a3b")
    ap.add_argument("--smoke", action="store_true", help="tiny models, CPU-sized everything")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --smoke)")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 (float32 with --smoke)")
    ap.add_argument("--backend", default=None, choices=sorted(backends()), help="default: triton if it runs")
    ap.add_argument("--prefill-chunk", type=int, default=None)
    ap.add_argument("--decode-tokens", type=int, default=None)
    ap.add_argument("--hf-tokens", type=int, default=None)
    ap.add_argument("--proposal-ids", type=int, default=32768, help="rows of the timed proposal head")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument(
        "--spec-ks", default="", help="speculative rows: drafts per round, comma list (default by mode)"
    )
    ap.add_argument(
        "--spec-acceptance", default="", help="speculative rows: oracle acceptance in %%, comma list"
    )
    ap.add_argument("--spec-batches", default="", help="speculative rows: batch sizes, comma list")
    ap.add_argument("--quick", action="store_true", help="fewer sizes (512/4k TTFT, batch 1 and 8, k 1/3/5)")
    ap.add_argument("--weights", default="bf16", choices=PROFILES,
                    help="weight profile of the random model (quantized profiles draw the planes directly)")  # fmt: skip
    ap.add_argument(
        "--compile", default="", help="models (comma list) timed decoding through compiled layer steps"
    )
    ap.add_argument(
        "--skip", default="", help="sections to leave out: eager,compiled,ttft,prefill,int8,spec,hf"
    )
    ap.add_argument("--startup", default="", help="models (comma list) timed for a cold and a warm start")
    ap.add_argument("--budget-s", type=float, default=540.0, help="skip later sections past this")
    # child mode: one model in this process (the parent runs each model in its own process)
    ap.add_argument("--one-model", default="", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--bw-tbps", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--peak-tflops", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    smoke = args.smoke
    args.device = args.device or ("cpu" if smoke else "cuda")
    args.dtype = args.dtype or ("float32" if smoke else "bfloat16")
    args.backend = args.backend or default_backend(args.device)
    args.prefill_chunk = args.prefill_chunk or (64 if smoke else 8192)
    args.decode_tokens = args.decode_tokens or (8 if smoke else 64)
    args.hf_tokens = args.hf_tokens or (4 if smoke else 16)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("ops/bench/run.py needs a CUDA device (or --smoke / --device cpu)")
    return args


def main() -> None:
    args = parse_args()
    if args.one_model:
        run_one_model(args)
        return
    budget = Budget(args.budget_s)
    cache = setup_compile_cache()

    cuda = args.device.startswith("cuda")
    meta = provenance("ops/bench/run.py", sys.argv[1:])
    commit = meta["commit"]
    result: dict[str, Any] = {
        **{k: meta[k] for k in ("commit", "uncommitted_files", "date")},
        "gpu": meta["gpu"] if cuda else None,
        "device": args.device,
        "smoke": args.smoke,
        "weights": args.weights,
        **{k: meta[k] for k in ("torch", "triton", "command")},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = "" if args.weights == "bf16" else f"-{args.models.replace(',', '-')}-{args.weights}"
    path = out / f"{dt.date.today().isoformat()}-{commit}{profile}{'-smoke' if args.smoke else ''}.json"
    mm = (1024, torch.float32) if args.smoke else (8192, torch.bfloat16)
    result["copy_bandwidth_TBps"] = copy_bandwidth_TBps(args.device, (64 << 20) if args.smoke else 4 * GiB)
    result["matmul_bf16_TFLOPs"] = matmul_peak_TFLOPs(args.device, mm[0], mm[1], reps=5 if args.smoke else 20)
    log(f"copy {result['copy_bandwidth_TBps']:.3f} TB/s, matmul {result['matmul_bf16_TFLOPs']:.2f} TFLOP/s")
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()  # the children need the memory
    result["models"] = {}
    names = args.models.split(",")
    for i, name in enumerate(names):
        share = max(budget.left(), 0.0) / (len(names) - i)  # time a model leaves goes to the next
        bw, peak = result["copy_bandwidth_TBps"], result["matmul_bf16_TFLOPs"]
        result["models"][name] = run_child(name, args, bw, peak, share)
        if "error" in result["models"][name]:
            log(f"{name}: {result['models'][name]['error']}")
        write_json(path, result)
    for name in filter(None, args.startup.split(",")):
        if budget.left() < 120:
            result.setdefault("skipped", []).append(f"startup {name}")
            continue
        log(f"{name}: cold and warm start")
        row = startup_rows(name, args.device, args.dtype, args.backend, bool(args.compile), args.smoke,
                           timeout_s=max(budget.left(), 60))  # fmt: skip
        result.setdefault("startup", {})[name] = row
        log(f"{name}: warm start ready in {row.get('warm_ready_s', float('nan')):.1f} s")
        write_json(path, result)
    result["compile_cache"] = cache.report()
    result["wall_s"] = time.perf_counter() - budget.t0
    write_json(path, result)
    print(f"\nwrote {path}")
    print(summary_table(result))


if __name__ == "__main__":
    main()
