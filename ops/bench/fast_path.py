"""Fast-path check calibrated by the reference path's own bf16 noise at the same depth.

A deep random bf16 model amplifies any rounding difference, so "fast vs reference" alone cannot
tell a bug from chaos. The reference backend is run three ways on the same prompt: in one prefill
chunk, in two chunks (200 + rest: the chunked GDN rule and attention see a boundary), and as a
prefill of all but the last token plus one decode step (the step ops). Those are equally valid
bf16 computations of the same logits; their spread is the noise. The fast backend is run in one
chunk and as prefill + decode step, each compared with the reference run of the same shape.
The check fails when a fast error exceeds NOISE_MULT x the noise (and the absolute floor).

MoE models: the router's top-k meets exact ties (bf16 logits over 256 experts tie often), and
which of two tied experts wins is implementation-defined (torch.topk itself differs between its
CPU and CUDA kernels); one flipped expert moves a deep random model's logits far past the noise.
So the fast path is also run with the reference router ("same router"), the check is judged on
that run, and the full fast-path error is reported next to it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ninfer.kernels.dispatch import Ops, get_ops
from ninfer.model.cache import KVPool, StatePool, make_batch
from ninfer.model.qwen35 import Qwen35Model

NOISE_MULT = 3.0  # a fast error up to 3x the reference's own spread is bf16 noise
ABS_FLOOR = 2e-2  # below this relative error the fast path passes whatever the noise
PROMPT = 300


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| over float32 logits."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def last_logits(model: Qwen35Model, ops: Ops, ids: list[int], chunks: list[int], device: str) -> torch.Tensor:
    """Float32 logits of the last token after running `ids` in prefill/decode calls of `chunks` tokens."""
    cfg = model.config
    model.set_ops(ops)
    kv = KVPool.for_config(cfg, 8, torch.bfloat16, device)
    st = StatePool.for_config(cfg, 2, torch.bfloat16, device)
    if -(-len(ids) // 64) > 5:
        raise ValueError(f"at most {5 * 64} prompt tokens")
    start = 0
    with torch.inference_mode():
        for n in chunks:
            batch = make_batch([ids[start : start + n]], [start], [0], [list(range(5))], 8, device)
            h = model(batch, kv, st)
            start += n
        return model.logits(h[0, -1]).float()


def check_fast_path(
    model: Qwen35Model,
    backend: str,
    ids: list[int],
    device: str = "cuda",
    fast_ops: Ops | None = None,
    router_rows: int = 4096,
) -> dict[str, Any]:
    """Fast vs reference last-token logits, with the reference's bf16 noise (see the module doc).
    `fast_ops` overrides the op set of `backend` (tests on the CPU interpreter)."""
    if backend == "reference":
        return {"backend": "reference", "checked": False, "note": "no fast backend selected"}
    ids = list(ids[:PROMPT])
    split = min(200, len(ids) // 2)
    one, two, step = [len(ids)], [split, len(ids) - split], [len(ids) - 1, 1]
    ref_ops = get_ops(device, "reference")
    fast_ops = fast_ops or get_ops(device, backend)
    ref = {
        name: last_logits(model, ref_ops, ids, c, device)
        for name, c in (("one", one), ("two", two), ("step", step))
    }
    fast = {name: last_logits(model, fast_ops, ids, c, device) for name, c in (("one", one), ("step", step))}
    err = {"one_chunk": rel(fast["one"], ref["one"]), "prefill_plus_step": rel(fast["step"], ref["step"])}
    out: dict[str, Any] = {"backend": backend, "checked": True, "rel_err_last_logits": err["one_chunk"]}
    router_ok = True
    if model.config.is_moe:  # judged with the reference router (see the module doc)
        out["router"] = check_router(fast_ops, ref_ops, model.config.num_experts or 0,
                                     model.config.num_experts_per_tok or 0, device, router_rows)  # fmt: skip
        router_ok = out["router"]["ok"]
        out["rel_err_full"] = err
        if fast_ops.moe_route is not ref_ops.moe_route:  # else the run above was the same-router run
            same = dataclasses.replace(fast_ops, moe_route=ref_ops.moe_route)
            fast = {
                name: last_logits(model, same, ids, c, device) for name, c in (("one", one), ("step", step))
            }
            err = {
                "one_chunk": rel(fast["one"], ref["one"]),
                "prefill_plus_step": rel(fast["step"], ref["step"]),
            }
        out["rel_err_same_router"] = err
    model.set_ops(fast_ops)
    noise = {"two_chunks": rel(ref["two"], ref["one"]), "prefill_plus_step": rel(ref["step"], ref["one"])}
    bound = max(NOISE_MULT * max(noise.values()), ABS_FLOOR)
    return {
        **out,
        "rel_err": err,
        "reference_noise": noise,
        "bound": bound,
        "rule": f"fail when rel_err > max({NOISE_MULT} x max(reference_noise), {ABS_FLOOR})",
        "err_over_noise": max(err.values()) / max(max(noise.values()), 1e-30),
        "top1_agree": {
            "one_chunk": bool(fast["one"].argmax() == ref["one"].argmax()),
            "reference_two_chunks": bool(ref["two"].argmax() == ref["one"].argmax()),
        },
        "ok": max(err.values()) <= bound and router_ok,
    }


def check_router(
    fast_ops: Ops, ref_ops: Ops, experts: int, k: int, device: str, rows: int = 4096
) -> dict[str, Any]:
    """The fast router on random bf16 logits: its choice may differ from the reference only among
    tied experts, and its weights by bf16 rounding (relative 1e-2)."""
    gen = torch.Generator().manual_seed(11)
    logits = (torch.randn(rows, experts, generator=gen) * 2).to(device, torch.bfloat16)
    i1, w1 = fast_ops.moe_route(logits, k)
    i0, w0 = ref_ops.moe_route(logits, k)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    chosen1 = probs.gather(1, i1).sort(-1).values  # [rows, k] probabilities of the chosen experts
    chosen0 = probs.gather(1, i0).sort(-1).values
    differ = (i1.sort(-1).values != i0.sort(-1).values).any(-1)  # another expert set
    non_tie = int((chosen1 != chosen0).any(-1).sum())
    same = ~differ
    w_err = (
        ((w1[same].float() - w0[same].float()).abs() / w0[same].float().abs()).max().item()
        if same.any()
        else 0.0
    )
    return {
        "rows": rows,
        "tie_flips": int(differ.sum()) - non_tie,
        "non_tie_mismatch": non_tie,
        "max_rel_w_err": w_err,
        "ok": non_tie == 0 and w_err <= 1e-2,
    }
