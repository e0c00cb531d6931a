"""GPU check (not collected by pytest): fla prefill vs the reference chunked rule, MoE variants in CUDA graphs,
and which triton-backend op accounts for the 35B-A3B prefill logit error.

Run on a CUDA machine from the repo root with fla-core importable:
    python tests/kernels/gpu_check_ops.py [--out results.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable

import gpu_check_model as model_check
import torch

from ninfer.kernels import gdn_ref, get_ops, moe_ref
from ninfer.kernels.moe_grouped import moe_experts_gathered, moe_experts_grouped
from ninfer.kernels.triton.backend import fla_chunk_rule

DEV = torch.device("cuda")
RESULTS: dict[str, object] = {}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def timed(fn: Callable[[], object], reps: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def fla_vs_reference() -> None:
    """o and final state of fla's chunk rule (through our wrapper) vs gdn_ref, real head shapes."""
    fla = fla_chunk_rule()
    assert fla is not None, "fla does not import"
    res: dict[str, object] = {}
    gen = torch.Generator(device=DEV).manual_seed(0)
    for nk, nv, t, dtype in ((16, 48, 300, torch.float32), (16, 48, 2048, torch.bfloat16),
                             (16, 32, 300, torch.bfloat16)):  # fmt: skip
        q, k = (torch.randn(1, t, nk, 128, generator=gen, device=DEV).to(dtype) for _ in range(2))
        v = torch.randn(1, t, nv, 128, generator=gen, device=DEV).to(dtype)
        a, b = (torch.randn(1, t, nv, generator=gen, device=DEV) for _ in range(2))
        a_log = torch.empty(nv, device=DEV).uniform_(0.01, 4, generator=gen).log()
        g, beta = gdn_ref.gdn_gates(a, b.to(dtype), a_log, torch.randn(nv, generator=gen, device=DEV) * 0.5)
        h0 = torch.randn(1, nv, 128, 128, generator=gen, device=DEV) * 0.3
        o_r, s_r = gdn_ref.chunk_gated_delta_rule(q, k, v, g, beta, h0)
        o_f, s_f = fla(q, k, v, g, beta, h0)
        key = f"nv{nv}_T{t}_{str(dtype).split('.')[-1]}"
        res[f"{key}/o_rel_err"] = rel(o_f, o_r)
        res[f"{key}/state_rel_err"] = rel(s_f, s_r)
        res[f"{key}/fla_ms"] = round(
            timed(lambda q=q, k=k, v=v, g=g, beta=beta, h0=h0: fla(q, k, v, g, beta, h0)), 3
        )
        res[f"{key}/reference_ms"] = round(
            timed(lambda q=q, k=k, v=v, g=g, beta=beta, h0=h0: gdn_ref.chunk_gated_delta_rule(q, k, v, g, beta, h0)),
            3,
        )  # fmt: skip
    RESULTS["fla_vs_reference"] = res
    print("fla", json.dumps(res, indent=1), flush=True)


def moe_in_graphs() -> None:
    """Replay time of one MoE expert op captured in a CUDA graph, 35B-A3B shapes (256 experts, top-8)."""
    gen = torch.Generator(device=DEV).manual_seed(1)
    e, h, ie, k = 256, 2048, 512, 8
    gate_up = (torch.randn(e, 2 * ie, h, generator=gen, device=DEV) / h**0.5).bfloat16()
    down = (torch.randn(e, h, ie, generator=gen, device=DEV) / ie**0.5).bfloat16()
    res: dict[str, object] = {}
    for n in (1, 4, 16):
        x = torch.randn(n, h, generator=gen, device=DEV).bfloat16()
        w, idx = torch.randn(n, e, generator=gen, device=DEV).softmax(-1).topk(k, -1)
        w = (w / w.sum(-1, keepdim=True)).bfloat16()
        for label, fn in (("grouped", moe_experts_grouped), ("gathered", moe_experts_gathered)):
            fn(x, gate_up, down, idx, w)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fn(x, gate_up, down, idx, w)
            graph.replay()
            res[f"n{n}/{label}/rel_err"] = rel(out, moe_ref.moe_experts(x, gate_up, down, idx, w))
            res[f"n{n}/{label}/graph_us"] = round(timed(graph.replay, 50) * 1e3, 1)
    RESULTS["moe_in_graphs"] = res
    print("moe graphs", json.dumps(res, indent=1), flush=True)


def attribution() -> None:
    """35B-A3B: triton backend with one op swapped back to the reference -> per-phase rel err."""
    model = model_check.random_model(model_check.config("35b-a3b"))
    ref_ops, fast = get_ops("cuda", "reference"), get_ops("cuda")
    variants = {
        "triton": fast,
        "triton_moe_ref": dataclasses.replace(fast, moe_experts=moe_ref.moe_experts),
        "triton_chunk_ref": dataclasses.replace(fast, chunk_gated_delta_rule=gdn_ref.chunk_gated_delta_rule),
        "triton_moe_and_chunk_ref": dataclasses.replace(
            fast, moe_experts=moe_ref.moe_experts, chunk_gated_delta_rule=gdn_ref.chunk_gated_delta_rule
        ),
    }
    model.set_ops(ref_ops)
    ref = model_check.phases(model, *model_check.pools(model.config, "bf16"))
    res: dict[str, object] = {}
    for name, ops in variants.items():
        model.set_ops(ops)
        out = model_check.phases(model, *model_check.pools(model.config, "bf16"))
        for phase in ("prefill", "decode", "verify"):
            res[f"{name}/{phase}/rel_err"] = rel(out[phase], ref[phase])
    RESULTS["attribution_35b_a3b"] = res
    print("attribution", json.dumps(res, indent=1), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    for label, fn in (("fla", fla_vs_reference), ("moe", moe_in_graphs), ("attribution", attribution)):
        try:
            fn()
        except Exception as err:  # one failing check must not hide the others
            RESULTS[f"{label}/error"] = f"{type(err).__name__}: {err}"[:500]
            print(label, "failed:", RESULTS[f"{label}/error"], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(RESULTS, f, indent=1)


if __name__ == "__main__":
    main()
