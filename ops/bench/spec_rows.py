"""Speculative-decoding rows: oracle-acceptance throughput per k / acceptance / batch, MTP draft-step cost.

The engine's oracle drafter (EngineConfig.spec_oracle_wrong_fraction) drafts the target's own
greedy continuation and replaces a fraction of the drafts by wrong tokens, so the acceptance rate
is set (wrong fraction = 1 - acceptance). Its drafting costs k plain target decode steps, not an
MTP's k draft steps, so each round's `propose` (one call for all rows) is timed and three numbers are kept per row:

* `oracle_raw`: tokens/s as run, the oracle's drafting included;
* `oracle_verify_only`: the same tokens over the time without drafting (an upper bound);
* `oracle` (the headline): drafting replaced by k measured MTP draft steps with the proposal head
  (`draft_step_ms`), i.e. the tokens/s an MTP drafter of this acceptance would give.

The draft step is timed as the engine runs it: `MTPDrafter.propose` of k drafts (k = 3 when swept,
else the largest k) divided by k, at every batch size, each lane holding k + 1 pending rows (a fully
accepted round), with random MTP weights of the trunk's shapes, through the full lm_head and
through a proposal head of `proposal_ids` rows. On a GPU the drafter's captured proposal graph
(one replay per round) is timed (`draft_step_mode` "graph"); where no graph could be captured
(the CPU, or a failed capture) the eager steps are, and the mode says "eager".
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from ninfer.engine.graphs import CudaCapture
from ninfer.engine.plan import DecodeRow
from ninfer.engine.sampler import RowSampler, SamplingOverrides, resolve_sampling
from ninfer.engine.speculative.draft_head import DraftHead
from ninfer.engine.speculative.mtp import MTPDrafter, Pending, rope_positions
from ninfer.engine.types import SamplingParams
from ninfer.model.qwen35 import Qwen35Model
from ops.bench.ceilings import median_seconds, sync
from ops.bench.engine_runs import EngineSpec, free, host_profile, kernel_table, make_engine, run_requests
from ops.bench.shapes import attach_mtp, random_prompt

PAGE = 64


@dataclasses.dataclass(frozen=True)
class SpecSizes:
    ks: tuple[int, ...]  # drafts per round
    acceptance_pct: tuple[int, ...]  # oracle acceptance in percent
    batches: tuple[int, ...]
    context: int  # prompt tokens per request
    decode_tokens: int  # tokens generated per request (per row)
    proposal_ids: int  # rows of the proposal head


def draft_step_ms(
    model: Qwen35Model,
    head: DraftHead | None,
    bs: int,
    context: int,
    k: int,
    reps: int,
    profile: dict[str, Any] | None = None,
) -> tuple[float, str]:
    """Median ms per draft of the MTP drafter's greedy proposal of k drafts at `bs` rows after
    `context` tokens, and the mode timed ("graph": one captured replay per round, "eager").
    `profile`, when given and on a GPU, receives `draft_replay_profile` of the graph."""
    dev = model.lm_head.weight.device
    dtype = model.lm_head.weight.dtype
    per = -(-(context + k + 1) // PAGE)
    drafter = MTPDrafter(model, per * bs, bs, per, dtype, dev, head, draft_tokens=k, max_batch=bs)
    drafter.capture_graphs(CudaCapture(dev) if dev.type == "cuda" else None, sizes=[bs])
    mode = "graph" if drafter.graphs is not None else "eager"
    greedy = RowSampler(resolve_sampling(SamplingParams(temperature=0.0), None, SamplingOverrides()))
    rows = [DecodeRow(i, 1, context, i, list(range(i * per, (i + 1) * per)), greedy) for i in range(bs)]
    start = context - (k + 1)
    hidden = torch.randn(k + 1, model.config.hidden_size, device=dev, dtype=dtype)  # [k+1, H]
    pending = Pending(start, tuple(range(1, k + 2)), hidden, rope_positions([start], k + 1, dev)[:, 0])

    def step() -> None:
        for r in rows:  # a fully accepted round left k + 1 pending rows on every lane
            drafter.pending[r.slot] = pending
        drafter.propose(rows, k)

    with torch.inference_mode():
        secs = median_seconds(step, dev, reps, 3)
        if profile is not None and drafter.graphs is not None:
            profile.update(draft_replay_profile(functools.partial(drafter.graphs.replay, bs), dev, k))
            profile["host_profile_per_round"] = host_profile(step, dev)  # what the engine adds to a replay
    return secs * 1e3 / k, mode


def draft_replay_profile(replay: Callable[[], None], dev: torch.device, k: int) -> dict[str, Any]:
    """The captured proposal replayed alone (its last inputs, no host work): ms per draft step,
    and its kernels per round (against `draft_step_ms`, the engine's host share)."""
    from torch.profiler import ProfilerActivity, profile

    replay_ms = median_seconds(replay, dev, 10, 3) * 1e3 / k
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        sync(dev)
    return {"replay_ms_per_step": replay_ms, "per_round": kernel_table(prof, True)}


def proposal_head(model: Qwen35Model, n: int) -> DraftHead:
    """A proposal head over n random ids (rows copied from the lm_head, as the artifact's would be)."""
    vocab = model.config.vocab_size
    ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(5))[:n].sort().values
    ids = ids.to(model.lm_head.weight.device)
    return DraftHead(ids, model.lm_head.weight[ids].clone(), vocab)


class ProposeTimer:
    """Wraps a drafter's `propose` on one engine: start time and synchronized seconds of each call."""

    def __init__(self, drafter: Any, device: torch.device) -> None:
        self.calls: list[tuple[float, float]] = []
        inner = drafter.propose

        def timed(rows: Any, k: int) -> Any:
            sync(device)
            t0 = time.perf_counter()
            out = inner(rows, k)
            sync(device)
            self.calls.append((t0, time.perf_counter() - t0))
            return out

        drafter.propose = timed

    def within(self, start: float, end: float) -> tuple[int, float]:
        """Calls (count, seconds) that started inside [start, end]."""
        hits = [d for t, d in self.calls if start <= t <= end]
        return len(hits), sum(hits)


def spec_section(
    model: Qwen35Model,
    es: EngineSpec,
    sizes: SpecSizes,
    plain_tok_s: dict[str, float],
    left: Callable[[], float],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The `spec` JSON of one model (see the module doc); rows past the budget (`left()` seconds
    below a guess of their cost) are listed under `skipped`."""
    vocab = model.config.vocab_size
    attach_mtp(model, es.device, model.lm_head.weight.dtype)
    try:
        head = proposal_head(model, min(sizes.proposal_ids, vocab))
        k_step = 3 if 3 in sizes.ks else max(sizes.ks)
        full_ms, prop_ms, modes = {}, {}, set()
        profiles: dict[str, dict[str, Any]] = {"full_head": {}, "proposal_head": {}}
        for bs in sizes.batches:
            for name, table, h in (("full_head", full_ms, None), ("proposal_head", prop_ms, head)):
                prof = profiles[name] if bs == min(sizes.batches) and es.device.startswith("cuda") else None
                table[str(bs)], mode = draft_step_ms(model, h, bs, sizes.context, k_step, 10, prof)
                modes.add(mode)
    finally:
        model.mtp = None
    b1 = str(min(sizes.batches))
    out: dict[str, Any] = {
        "draft_step_ms": {"full_head": full_ms[b1], "proposal_head": prop_ms[b1]},
        "draft_step_mode": modes.pop() if len(modes) == 1 else "mixed",
        "draft_step_k": k_step,
        "draft_step_ms_by_bs": {"full_head": full_ms, "proposal_head": prop_ms},
        "proposal_head_ids": head.size,
        "proposal_head_step_ratio": full_ms[b1] / prop_ms[b1],
        "draft_replay_profile_bs1": profiles,
        "context": sizes.context,
        "decode_tokens": sizes.decode_tokens,
        "oracle": {},
        "oracle_raw": {},
        "oracle_verify_only": {},
        "acceptance_rate": {},  # accepted / drafted tokens (the last round of a request may be cut short)
        "mean_accepted_per_round": {},
        "skipped": [],
    }
    log(f"spec: draft step full {full_ms[b1]:.2f} ms, proposal {prop_ms[b1]:.2f} ms ({head.size} ids, "
        f"{out['draft_step_mode']}, k={k_step})")  # fmt: skip
    lanes = max(sizes.batches)
    max_ctx = sizes.context + sizes.decode_tokens + lanes + max(sizes.ks) + 2 * PAGE
    for k in sizes.ks:
        eng = make_engine(model, es, max_ctx, lanes, spec_method="mtp", draft_tokens=k,
                          spec_oracle_wrong_fraction=0.0)  # fmt: skip
        try:
            drafter = eng.spec.drafter
            if getattr(drafter, "name", "") != "oracle" or not hasattr(drafter, "wrong_fraction"):
                raise RuntimeError(f"expected the engine's oracle drafter, got {type(drafter).__name__}")
            timer = ProposeTimer(drafter, torch.device(es.device))
            run_requests(eng, [random_prompt(2 * PAGE, 99, vocab)], 4)  # warm-up
            for acc in sizes.acceptance_pct:
                drafter.wrong_fraction = 1.0 - acc / 100
                for bs in sizes.batches:
                    key = f"k={k} acc={acc} bs={bs}"
                    plain = plain_tok_s.get(str(bs))  # oracle round ~ k + 1 plain steps
                    guess = 2 * (k + 1) * (sizes.decode_tokens + bs) * bs / plain if plain else 0.0
                    if left() < guess:
                        out["skipped"].append(key)
                        continue
                    prompts = [random_prompt(sizes.context, 5000 * bs + i, vocab) for i in range(bs)]
                    r = run_requests(eng, prompts, sizes.decode_tokens + bs)
                    rounds, draft_s = timer.within(r["window_start"], r["window_end"])
                    mtp_s = rounds * k * prop_ms[str(bs)] / 1e3
                    toks, wall = r["window_tokens"], r["window_s"]
                    row = (str(k), str(acc), str(bs))
                    _put(out["oracle_raw"], row, toks / wall)
                    _put(out["oracle_verify_only"], row, toks / max(wall - draft_s, 1e-9))
                    _put(out["oracle"], row, toks / max(wall - draft_s + mtp_s, 1e-9))
                    # from the requests' counters: rounds overlap only partly across batched rows
                    _put(out["acceptance_rate"], row, r["accepted_tokens"] / max(r["drafted_tokens"], 1.0))
                    _put(out["mean_accepted_per_round"], row, k * _get(out["acceptance_rate"], row))
                    log(f"spec {key}: {_get(out['oracle'], row):.1f} tok/s "
                        f"(raw {toks / wall:.1f}, {rounds} rounds, oracle drafting {draft_s:.2f}s)")  # fmt: skip
        finally:
            free(eng)
    best = _get(out["oracle"], ("3", "100", "1"))
    if best is not None and plain_tok_s.get("1"):
        out["speedup_k3_acc100_bs1"] = best / plain_tok_s["1"]
    return out


def _put(table: dict[str, Any], row: tuple[str, str, str], value: float) -> None:
    k, acc, bs = row
    table.setdefault(k, {}).setdefault(acc, {})[bs] = value


def _get(table: dict[str, Any], row: tuple[str, str, str]) -> float | None:
    k, acc, bs = row
    return table.get(k, {}).get(acc, {}).get(bs)
