"""Speculative decoding leaves greedy outputs unchanged on the GPU: bf16 and int8 KV, k = 1..5, with
and without the proposal head, one request alone and eight at once, against spec off.

The model is a small random one of the 27B family's layout (smoke widths: GDN and attention
layers, an MTP head) run by the fast path with CUDA graphs. Its lm_head is scaled up (`--gain`)
so each greedy choice has a margin well above bf16 rounding: verification runs q = k + 1 rows
through kernels that round differently from the q = 1 decode step, and at random weights' near-
ties that alone flips tokens, which would hide what this checks (the speculative machinery:
per-position state slots, rollback, KV rewrites, commits, proposal head) behind numerics.
Every output must equal spec off token for token; the JSON lists any difference.

    python ops/bench/spec_identity.py --out DIR          # a CUDA device
    python ops/bench/spec_identity.py --smoke --out DIR  # the same on the CPU (float32 reference)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ninfer.engine.engine import Engine
from ninfer.engine.types import GenerationRequest, SamplingParams
from ops.bench.engine_runs import EngineSpec, free, make_engine
from ops.bench.report import provenance
from ops.bench.shapes import attach_mtp, build_model, hf_shape, random_prompt
from ops.bench.spec_rows import proposal_head


def generate(
    engine: Engine, prompts: list[tuple[int, ...]], max_tokens: int, cached: list[int] | None = None
) -> list[list[int]]:
    """Greedy tokens of every prompt, all submitted at once; `cached` receives each request's
    cached prompt tokens (prefix reuse)."""
    handles = []
    for i, p in enumerate(prompts):
        req = GenerationRequest(
            f"id-{i}", p, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        )
        handles.append(engine.submit(engine.reserve(), req))
    out = []
    for h in handles:
        tokens, _ = h.result(300.0)
        h.close()
        out.append(list(tokens))
        if cached is not None:
            cached.append(h.stats.cached_tokens)
    return out


def outputs(engine: Engine, prompts: list[tuple[int, ...]], max_tokens: int) -> dict[str, Any]:
    """The first prompt alone, all eight at once, then two-turn conversations on the last two
    prompts (turn 2 = turn 1's prompt and output + new tokens: a prefix-cache hit); the engine is
    freed afterwards. `cached_turn2`: the second turns' cached prompt tokens (> 0: a hit)."""
    try:
        out: dict[str, Any] = {
            "alone": generate(engine, prompts[:1], max_tokens),
            "batch8": generate(engine, prompts, max_tokens),
        }
        first = prompts[6:]
        turn1 = generate(engine, first, max_tokens)
        turn2 = [(*p, *o, *p[:9]) for p, o in zip(first, turn1, strict=True)]
        cached: list[int] = []
        out["reuse"] = turn1 + generate(engine, turn2, max_tokens, cached)
        out["cached_turn2"] = cached
        return out
    finally:
        free(engine)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--ks", default="1,2,3,4,5")
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--gain", type=float, default=8.0, help="lm_head scale (greedy margins over bf16 noise)")
    args = ap.parse_args()
    dev, backend, dtype = (
        ("cpu", "reference", torch.float32) if args.smoke else ("cuda", "triton", torch.bfloat16)
    )
    t0 = time.perf_counter()
    model = build_model(hf_shape("qwen3.6-27b", True), backend, dev, dtype)
    with torch.no_grad():
        model.lm_head.weight.mul_(args.gain)
    attach_mtp(model, dev, dtype)
    head = proposal_head(model, model.config.vocab_size // 4)
    es = EngineSpec(dev, str(dtype).removeprefix("torch."), 64)
    vocab = model.config.vocab_size
    prompts = [random_prompt(40 + 23 * i, 300 + i, vocab) for i in range(8)]
    max_ctx = 2 * (40 + 23 * 7 + args.tokens) + 9 + 5 + 128  # a second turn doubles a prompt
    res: dict[str, Any] = {
        **provenance("ops/bench/spec_identity.py", sys.argv[1:]),
        "runs": {},
        "differences": [],
        "cached_turn2": {},
    }
    for kv in (es.dtype, "int8"):  # the model dtype's KV (bf16 on the GPU), then int8
        kv_dtype = "int8" if kv == "int8" else None
        want = outputs(
            make_engine(model, es, max_ctx, 8, kv_dtype=kv_dtype, prefix_reuse=True), prompts, args.tokens
        )
        res["cached_turn2"][f"{kv} spec off"] = want.pop("cached_turn2")
        for k in (int(x) for x in args.ks.split(",")):
            for reduced in (False, True):
                extra = {
                    "spec_method": "mtp",
                    "draft_tokens": k,
                    "lm_head_draft": reduced,
                    "kv_dtype": kv_dtype,
                }
                eng = make_engine(
                    model, es, max_ctx, 8, draft_head=head if reduced else None, prefix_reuse=True, **extra
                )
                got = outputs(eng, prompts, args.tokens)
                key = f"{kv} k={k} {'proposal' if reduced else 'full'}"
                res["cached_turn2"][key] = got.pop("cached_turn2")
                same = {m: got[m] == want[m] for m in want}
                res["runs"][key] = same
                for m in want:
                    for i, (a, b) in enumerate(zip(got[m], want[m], strict=True)):
                        if a != b:
                            first = next(j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
                            res["differences"].append(
                                {"run": key, "mode": m, "request": i, "first_diff": first}
                            )
                print(f"{key}: {same}", flush=True)
    hits = all(c > 0 for cs in res["cached_turn2"].values() for c in cs)
    res["identical"] = not res["differences"] and hits  # every second turn must be a cache hit too
    res["seconds"] = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "spec_identity.json").write_text(json.dumps(res, indent=1))
    print(
        "identical"
        if res["identical"]
        else f"NOT IDENTICAL: {res['differences'][:5]}, hits {res['cached_turn2']}"
    )


if __name__ == "__main__":
    main()
