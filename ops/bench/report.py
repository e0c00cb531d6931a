"""The result file (written after every section) and the closing summary table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def artifact_args(doc: str | None, argv: list[str]) -> tuple[argparse.ArgumentParser, list[str], list[str]]:
    """A parser with the arguments every benchmark of one artifact takes (ARTIFACT, --model, --out,
    --smoke; add more before parsing), the benchmark's own arguments and the server flags after `--`."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact")
    p.add_argument("--model", required=True, help="result name: qwen3.6-27b or qwen3.6-35b-a3b")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--smoke", action="store_true", help="small, on the CPU (the test suite)")
    cut = argv.index("--") if "--" in argv else len(argv)
    return p, argv[:cut], argv[cut + 1 :]


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")


def summary_table(result: dict[str, Any]) -> str:
    """One line per model: decode tok/s, roofline, eager, HF, TTFT, prefill, MFU, spec, int8 KV, fast path."""
    nan = float("nan")
    lines = [
        f"{'model':18} {'bs1':>7} {'bs2':>7} {'bs4':>7} {'bs8':>7} {'roof1':>7} {'eager1':>7} {'hf1':>6} "
        f"{'ttft':>7} {'pf':>7} {'mfu':>6} {'kern1':>6} {'spec3x':>6} {'i8x1':>5} {'fp_err':>7} {'noise':>7} {'fp':>4}"
    ]
    for name, r in result.get("models", {}).items():
        if "error" in r:
            lines.append(f"{name:18} ERROR {r['error'][:200]}")
        if "decode_tok_s" not in r:
            continue
        d = r.get("decode_tok_s", {})
        prof = next((p for p in r.get("profile", []) if p.get("bs") == 1), {})
        fp = r.get("fast_path", {})
        noise = max(fp.get("reference_noise", {}).values(), default=nan)
        ttft = r.get("ttft_ms", {})
        ttft_mid = ttft[sorted(ttft, key=int)[len(ttft) // 2]] if ttft else nan
        spec = r.get("spec", {}).get("speedup_k3_acc100_bs1", nan)
        int8 = (r.get("int8_kv") or {}).get("decode_vs_model_dtype", {}).get("1", nan)  # int8 / bf16 KV
        lines.append(
            f"{name:18} {d.get('1', nan):7.1f} {d.get('2', nan):7.1f} {d.get('4', nan):7.1f} {d.get('8', nan):7.1f} "
            f"{r.get('roofline_decode_tok_s_bs1', nan):7.1f} {r.get('eager_decode_tok_s_bs1', nan):7.1f} "
            f"{r.get('hf_decode_tok_s_bs1') or nan:6.2f} {ttft_mid:7.1f} "
            f"{r.get('prefill_tok_s_8k', nan):7.0f} {r.get('prefill_mfu_8k', nan):6.3f} "
            f"{prof.get('kernels_per_step', -1):6d} {spec:6.2f} {int8:5.2f} {fp.get('rel_err_last_logits', nan):7.4f} "
            f"{noise:7.4f} {'ok' if fp.get('ok') else ('-' if not fp.get('checked') else 'FAIL'):>4}"
        )
    return "\n".join(lines)


def provenance(script: str, argv: list[str]) -> dict[str, Any]:
    """Where a result comes from: commit ($NINFER_COMMIT, else git), uncommitted tracked files,
    UTC date, torch / Triton versions, GPU name and the command line."""
    import datetime as dt
    import os
    import subprocess

    import torch

    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=root).stdout.strip()
        except OSError:
            return ""

    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {
        # $NINFER_COMMIT first: a copied tree's git metadata can lag behind its files
        "commit": os.environ.get("NINFER_COMMIT") or git("rev-parse", "--short", "HEAD") or "unknown",
        "uncommitted_files": len(git("status", "--short", "--untracked-files=no").splitlines()),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "triton": triton_version,
        "command": " ".join(["python", script, *argv]),
    }
