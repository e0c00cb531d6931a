"""Speculative-decoding rows: oracle-acceptance throughput per k / acceptance / batch, MTP draft-step cost.

The engine's oracle drafter (EngineConfig.spec_oracle_wrong_fraction) drafts the target's own
greedy continuation and replaces a fraction of the drafts by wrong tokens, so the acceptance rate
is set (wrong fraction = 1 - acceptance). Its drafting costs k plain target decode steps, not an
MTP's k draft steps, so each round's `propose` (one call for all rows) is timed and three numbers are kept per row:

* `oracle_raw`: tokens/s as run, the oracle's drafting included;
* `oracle_verify_only`: the same tokens over the time without drafting (an upper bound);
* `oracle` (the headline): drafting replaced by k measured MTP draft steps with the proposal head
  (`draft_step_ms`), i.e. the tokens/s an MTP drafter of this acceptance would give.

The draft step (one MTP layer forward + draft logits + argmax, what MTPDrafter does per draft) is
timed with random MTP weights of the trunk's shapes, through the full lm_head and through a
proposal head of `proposal_ids` rows. Speculative rounds run eagerly (the engine captures no CUDA
graphs with a drafter), the plain decode they are compared with replays graphs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from ninfer.engine.spec.draft_head import DraftHead
from ninfer.engine.spec.mtp import rope_positions
from ninfer.model.cache import KVPool, make_batch
from ninfer.model.qwen35 import Qwen35Model
from ops.bench.ceilings import median_seconds, sync
from ops.bench.engine_runs import EngineSpec, free, make_engine, run_requests
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
    model: Qwen35Model, head: Callable[[torch.Tensor], torch.Tensor], bs: int, context: int, reps: int
) -> float:
    """Median ms of one MTP draft step at `bs` rows after `context` tokens: MTP layer forward on
    the previous step's hidden, draft logits through `head`, argmax to the host."""
    mtp = model.mtp
    assert mtp is not None
    dev = model.lm_head.weight.device
    dtype = model.lm_head.weight.dtype
    per = -(-(context + 2) // PAGE)
    kv = KVPool.for_config(model.config, per * bs, dtype, dev, num_layers=1)
    pages = [list(range(i * per, (i + 1) * per)) for i in range(bs)]
    batch = make_batch([[1]] * bs, [context] * bs, [0] * bs, pages, per, dev,
                       positions=rope_positions([context] * bs, 1, dev))  # fmt: skip
    x = torch.randn(bs, model.config.hidden_size, device=dev, dtype=dtype)  # [B, H]

    def step() -> None:
        h = mtp(batch, x[:, None], kv)[:, 0]  # [B, H]
        head(h).argmax(-1).tolist()

    with torch.inference_mode():
        secs = median_seconds(step, dev, reps, 3)
    return secs * 1e3


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
        mtp = model.mtp
        assert mtp is not None
        full_ms = {str(bs): draft_step_ms(model, mtp.logits, bs, sizes.context, 10) for bs in sizes.batches}
        prop_ms = {str(bs): draft_step_ms(model, head.logits, bs, sizes.context, 10) for bs in sizes.batches}
    finally:
        model.mtp = None
    b1 = str(min(sizes.batches))
    out: dict[str, Any] = {
        "draft_step_ms": {"full_head": full_ms[b1], "proposal_head": prop_ms[b1]},
        "draft_step_ms_by_bs": {"full_head": full_ms, "proposal_head": prop_ms},
        "proposal_head_ids": head.size,
        "proposal_head_step_ratio": full_ms[b1] / prop_ms[b1],
        "context": sizes.context,
        "decode_tokens": sizes.decode_tokens,
        "oracle": {},
        "oracle_raw": {},
        "oracle_verify_only": {},
        "mean_accepted_per_round": {},
        "skipped": [],
    }
    log(f"spec: draft step full {full_ms[b1]:.2f} ms, proposal {prop_ms[b1]:.2f} ms ({head.size} ids)")
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
                    t_run = time.perf_counter()
                    r = run_requests(eng, prompts, sizes.decode_tokens + bs)
                    all_rounds, _ = timer.within(t_run, time.perf_counter())
                    rounds, draft_s = timer.within(r["window_start"], r["window_end"])
                    mtp_s = rounds * k * prop_ms[str(bs)] / 1e3
                    toks, wall = r["window_tokens"], r["window_s"]
                    row = (str(k), str(acc), str(bs))
                    _put(out["oracle_raw"], row, toks / wall)
                    _put(out["oracle_verify_only"], row, toks / max(wall - draft_s, 1e-9))
                    _put(out["oracle"], row, toks / max(wall - draft_s + mtp_s, 1e-9))
                    # every row's tokens after its first, over the rounds of the whole run
                    _put(
                        out["mean_accepted_per_round"],
                        row,
                        (sizes.decode_tokens + bs - 1) / max(all_rounds, 1) - 1,
                    )
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
