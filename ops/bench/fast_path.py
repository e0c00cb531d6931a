"""Fast-path check calibrated by the reference path's own bf16 noise at the same depth.

A deep random bf16 model amplifies any rounding difference, so "fast vs reference" alone cannot
tell a bug from chaos. The reference backend is run three ways on the same prompt: in one prefill
chunk, in two chunks (200 + rest: the chunked GDN rule and attention see a boundary), and as a
prefill of all but the last token plus one decode step (the step ops). Those are equally valid
bf16 computations of the same logits; their spread is the noise. The fast backend is run in one
chunk and as prefill + decode step, each compared with the reference run of the same shape.
The check fails when a fast error exceeds NOISE_MULT x the noise (and the absolute floor).
"""

from __future__ import annotations

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
    model: Qwen35Model, backend: str, ids: list[int], device: str = "cuda", fast_ops: Ops | None = None
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
    model.set_ops(fast_ops)
    noise = {"two_chunks": rel(ref["two"], ref["one"]), "prefill_plus_step": rel(ref["step"], ref["one"])}
    err = {"one_chunk": rel(fast["one"], ref["one"]), "prefill_plus_step": rel(fast["step"], ref["step"])}
    bound = max(NOISE_MULT * max(noise.values()), ABS_FLOOR)
    return {
        "backend": backend,
        "checked": True,
        "rel_err_last_logits": err["one_chunk"],
        "rel_err": err,
        "reference_noise": noise,
        "bound": bound,
        "rule": f"fail when a fast error > max({NOISE_MULT} x max(reference_noise), {ABS_FLOOR})",
        "err_over_noise": max(err.values()) / max(max(noise.values()), 1e-30),
        "top1_agree": {
            "one_chunk": bool(fast["one"].argmax() == ref["one"].argmax()),
            "reference_two_chunks": bool(ref["two"].argmax() == ref["one"].argmax()),
        },
        "ok": max(err.values()) <= bound,
    }
