"""Oracle probe: does each verification compute, bit for bit, what the oracle's forwards chose?

The oracle drafter (`ninfer.engine.speculative.oracle`) drafts with forwards of the verification's own
shape, so with no wrong drafts every draft should be accepted. This probe runs concurrent greedy
requests through an engine with that oracle on a shortened full-width model, records every target
forward of each round, and compares the verification's logits with those of oracle forward j at
positions 0..j (the positions whose inputs the two share):
- a difference at position 0 means the two forwards read different state (KV, GDN slots);
- differences only at later positions mean a forward is not causal (a position sees later inputs);
- none, with drafts still rejected, would mean the comparison itself is wrong.
It also replays one verification forward twice on identical inputs (bitwise determinism).

    python ops/bench/oracle_probe.py [--model qwen3.6-27b] [--layers 8] [--batches 1,8] [--out DIR]
    python ops/bench/oracle_probe.py --smoke     # tiny shapes, float32 reference ops on the CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ninfer.engine.step_io import StepOut, StepRows
from ops.bench.engine_runs import EngineSpec, free, make_engine, run_requests
from ops.bench.report import provenance
from ops.bench.shapes import attach_mtp, build_model, hf_shape, random_prompt


@dataclasses.dataclass
class Round:
    drafts: list[tuple[StepRows, torch.Tensor]] = dataclasses.field(default_factory=list)  # logits [B, q, V]


class Recorder:
    """Wraps the target forward: keeps the oracle forwards of the running round, compares at verify."""

    def __init__(self, forward: Any, k: int) -> None:
        self.forward, self.k = forward, k
        self.round = Round()
        self.rows: list[dict[str, Any]] = []  # one per (verification row)
        self.last_verify: StepRows | None = None

    def __call__(self, rows: StepRows) -> StepOut:
        out = self.forward(rows)
        if rows.writes is None:  # a plain decode step
            return out
        verify = all(w[-1] == s for w, s in zip(rows.writes, rows.slots, strict=True))
        if not verify:
            self.round.drafts.append((rows, out.logits.float().clone()))
            return out
        logits = out.logits.float()
        if self.last_verify is None or len(rows.tokens) >= len(self.last_verify.tokens):
            self.last_verify = rows  # the widest verification of the run
        for i in range(len(rows.tokens)):
            entry: dict[str, Any] = {"start": rows.cache_lens[i], "slot": rows.slots[i], "positions": []}
            for j, (drows, dlog) in enumerate(self.round.drafts):
                if drows.slots[i] != rows.slots[i] or drows.cache_lens[i] != rows.cache_lens[i]:
                    entry["mismatched_rows"] = True
                    continue
                diffs = [(dlog[i, t] - logits[i, t]).abs().max().item() for t in range(j + 1)]
                same_choice = bool(dlog[i, j].argmax() == logits[i, j].argmax())
                entry["positions"].append({"j": j, "max_abs_diff_by_pos": diffs, "same_choice": same_choice})
            self.rows.append(entry)
        self.round = Round()
        return out


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    drafts = [p for r in rows for p in r["positions"]]
    diff0 = sum(1 for p in drafts if p["max_abs_diff_by_pos"][0] > 0)
    later = sum(1 for p in drafts if p["max_abs_diff_by_pos"][0] == 0 and max(p["max_abs_diff_by_pos"]) > 0)
    return {
        "verified_rows": len(rows),
        "drafts": len(drafts),
        "same_choice": sum(p["same_choice"] for p in drafts),
        "differ_at_position_0": diff0,
        "differ_only_later": later,
        "bitwise_equal": sum(1 for p in drafts if max(p["max_abs_diff_by_pos"]) == 0),
        "mismatched_rows": sum(1 for r in rows if r.get("mismatched_rows")),
        "examples": [r for r in rows if any(max(p["max_abs_diff_by_pos"]) > 0 for p in r["positions"])][:4],
    }


def determinism(eng: Any, verify: StepRows) -> dict[str, Any]:
    """Two forwards of a recorded verification's rows that keep the live slots (the last token's
    state goes to a scratch slot, as the oracle's do): bitwise equal logits?"""
    lanes = eng.spec.scratch_slots
    k = len(verify.tokens[0]) - 1
    rows = dataclasses.replace(verify, writes=[[*lanes(s)[:k], lanes(s)[k - 1]] for s in verify.slots])
    a = eng.runner.forward(rows).logits.float().clone()
    c = eng.runner.forward(rows).logits.float().clone()
    b = len(rows.tokens)
    return {"batch": b, "max_abs_diff": (a - c).abs().max().item(), "graph": eng.runner.graphs is not None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3.6-27b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    dev, backend, dtype = (
        ("cpu", "reference", torch.float32) if args.smoke else ("cuda", "triton", torch.bfloat16)
    )
    shape = dict(hf_shape(args.model, args.smoke), num_hidden_layers=args.layers)
    t0 = time.perf_counter()
    model = build_model(shape, backend, dev, dtype)
    attach_mtp(model, dev, dtype)
    batches = [int(x) for x in args.batches.split(",")]
    es = EngineSpec(dev, str(dtype).removeprefix("torch."), 2048)
    lanes = max(batches)
    max_ctx = args.context + 37 * lanes + args.tokens + 64 * 4  # the staggered prompts are longer
    eng = make_engine(model, es, max_ctx, lanes, spec_method="mtp", draft_tokens=args.k,
                      spec_oracle_wrong_fraction=0.0)  # fmt: skip
    result: dict[str, Any] = {
        **provenance("ops/bench/oracle_probe.py", sys.argv[1:]),
        "model": args.model,
        "layers": args.layers,
        "k": args.k,
        "runs": {},
    }
    try:
        rec = Recorder(eng.spec._forward, args.k)
        checks = []
        eng.spec._forward = rec
        eng.spec.drafter._forward = rec
        vocab = model.config.vocab_size
        for b in batches:
            for mode in ("same_length", "staggered"):
                rec.rows, rec.last_verify = [], None
                lens = [args.context + (0 if mode == "same_length" else 37 * i) for i in range(b)]
                prompts = [random_prompt(n, 700 + i, vocab) for i, n in enumerate(lens)]
                r = run_requests(eng, prompts, args.tokens)
                s = summarise(rec.rows)
                s["acceptance_rate"] = r["accepted_tokens"] / max(r["drafted_tokens"], 1.0)
                result["runs"][f"bs{b}_{mode}"] = s
                if rec.last_verify is not None:
                    checks.append(rec.last_verify)
                print(f"bs{b} {mode}: acceptance {s['acceptance_rate']:.3f}; drafts {s['drafts']}, same choice "
                      f"{s['same_choice']}, bitwise equal {s['bitwise_equal']}, differ at pos 0 "
                      f"{s['differ_at_position_0']}, only later {s['differ_only_later']}", flush=True)  # fmt: skip
        eng.spec._forward = rec.forward
        eng.spec.drafter._forward = rec.forward
        with torch.inference_mode():  # the engine's buffers are inference tensors
            result["determinism"] = [determinism(eng, rows) for rows in checks]
        print("determinism:", result["determinism"], flush=True)
    finally:
        free(eng)
    result["seconds"] = time.perf_counter() - t0
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "oracle_probe.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
