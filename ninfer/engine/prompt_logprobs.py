"""Prompt logprobs: each prompt position's log-softmax over the vocabulary, scored against the
prompt token that follows it, a bounded block of positions at a time.

The prefill of a scoring request keeps the hidden states of its whole chunk; here they go through
the lm_head `SCORE_BLOCK` positions at a time ([block, V] float32 on the device, then freed), and
only the target's logprob and the top alternatives ([block] and [block, k]) reach the host: never a
vocabulary-sized row per prompt token. The values are the model's raw distribution (no sampling
parameters: a prompt token was not sampled), float32 log-softmax of the float32 logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ninfer.engine.types import TokenLogprob

SCORE_BLOCK = 64  # positions whose full logits exist at once (64 x 248k float32: 63 MB)


def score_positions(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: Sequence[int],
    top: int,
    block: int = SCORE_BLOCK,
) -> list[TokenLogprob]:
    """hidden [q, H] of a chunk's positions, `targets` the token after each of the first
    len(targets) positions (<= q) -> one `TokenLogprob` per target (its logprob, and the `top`
    most likely tokens at that position). `logits_fn`: hidden [n, H] -> float32 logits [n, V]
    (padded ids at -inf)."""
    n = len(targets)
    if n > hidden.shape[0]:
        raise ValueError(f"{n} targets for {hidden.shape[0]} positions")
    if n == 0:
        return []
    want = torch.tensor(list(targets), dtype=torch.int64, device=hidden.device)  # [n]
    chosen: list[torch.Tensor] = []
    tops_v: list[torch.Tensor] = []
    tops_i: list[torch.Tensor] = []
    for a in range(0, n, block):
        b = min(n, a + block)
        lsm = torch.log_softmax(logits_fn(hidden[a:b]).float(), dim=-1)  # [c, V]
        chosen.append(lsm.gather(1, want[a:b, None])[:, 0])  # [c]
        if top > 0:
            values, ids = lsm.topk(top, dim=-1)  # [c, k]
            tops_v.append(values)
            tops_i.append(ids)
        del lsm
    picked = torch.cat(chosen).tolist()
    alt_v = torch.cat(tops_v).tolist() if top > 0 else [[] for _ in range(n)]
    alt_i = torch.cat(tops_i).tolist() if top > 0 else [[] for _ in range(n)]
    return [
        TokenLogprob(int(t), float(lp), tuple(zip(ids, vals, strict=True)))
        for t, lp, ids, vals in zip(targets, picked, alt_i, alt_v, strict=True)
    ]
