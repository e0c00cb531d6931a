"""Cold vs warm start: time to the first token of a fresh process, with an empty then a filled compile cache.

`startup_rows` runs this file twice as a child process over one fresh cache directory
(NINFER_COMPILE_CACHE): the first start compiles every Triton kernel (and Inductor graph with
--compile), the second finds them on disk. Each child builds the random-weight model (the stand-in
for loading weights: `weights_s`), starts an engine (CUDA graph capture included) and serves one
short request (`ready_s` = engine start .. first token). The contract's bound: a warm start is
ready in under 60 s plus the weight load time, i.e. warm `ready_s` < 60.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def child(name: str, device: str, dtype: str, backend: str, compile_: bool, smoke: bool) -> dict[str, Any]:
    """One start in this process: weights, engine start + first token, the cache's report."""
    from ninfer.service.compile_cache import setup_compile_cache

    cache = setup_compile_cache()  # before torch / triton compile anything
    import torch

    from ops.bench.engine_runs import EngineSpec, make_engine, run_requests
    from ops.bench.shapes import build_model, hf_shape, random_prompt

    t0 = time.perf_counter()
    model = build_model(hf_shape(name, smoke), backend, device, getattr(torch, dtype))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    weights_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    es = EngineSpec(device=device, dtype=dtype, chunk=64 if smoke else 8192)
    eng = make_engine(model, es, 1024, 8, compile=compile_)
    r = run_requests(eng, [random_prompt(32, 1, model.config.vocab_size)], 1)
    ready_s = time.perf_counter() - t1
    eng.shutdown(5)
    return {
        "weights_s": weights_s,
        "ready_s": ready_s,
        "first_request_ttft_s": r["ttft_s"],
        "compile": compile_,
        "cache": cache.report(ready_s),
    }


def startup_rows(
    name: str, device: str, dtype: str, backend: str, compile_: bool, smoke: bool, timeout_s: float
) -> dict[str, Any]:
    """Cold then warm start of `name` in fresh processes over one new cache directory."""
    out: dict[str, Any] = {"model": name}
    with tempfile.TemporaryDirectory(prefix="ninfer-cc-") as cache:
        env = {**os.environ, "NINFER_COMPILE_CACHE": cache}
        for run in ("cold", "warm"):
            argv = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--device", device,
                    "--dtype", dtype, "--backend", backend] + ["--compile"] * compile_ + ["--smoke"] * smoke  # fmt: skip
            p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if p.returncode != 0 or not lines:
                out[run] = {"error": (p.stderr or p.stdout)[-500:]}
                break
            out[run] = json.loads(lines[-1])
    # seconds from the weights on the device to the first token: the ready_s_cold / _warm
    for run in ("cold", "warm"):
        if "ready_s" in out.get(run, {}):
            out[f"ready_s_{run}"] = out[run]["ready_s"]
    if "ready_s_warm" in out:
        out["warm_ready_s"] = out["ready_s_warm"]
        out["warm_ready_under_60s"] = out["ready_s_warm"] < 60.0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--child", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    print(
        json.dumps(child(a.child, a.device, a.dtype, a.backend, a.compile, a.smoke), default=str), flush=True
    )


if __name__ == "__main__":
    main()
