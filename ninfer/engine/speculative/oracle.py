"""Oracle drafter, a testing and benchmarking aid: drafts are the target's own greedy continuation.

It drafts with k target forwards of the verification's own shape (B rows of k+1 tokens, the
runner's verify graph when captured): forward j feeds [t_last, d_1..d_j] padded to k+1 tokens and
takes its choice at position j. Every kernel of a forward treats its rows independently and causally,
so that choice is bit-for-bit what verification will compute there; drafting with q = 1 decode steps
instead would meet near-tied logits that the q = 1 and q = k+1 GEMMs (different reduction orders)
break differently, and "every draft right" would accept only about two in three at random weights.
The forwards read each row's live GDN slot and write the per-token states into the lane's scratch
slots (never the live one); the KV rows they write past the committed prefix are rewritten by the
verification. Its cost is k target forwards, not an MTP's draft steps: time it separately.

Constrained rows draft under their grammar masks, the masks verification applies at each position
(the sampler's lookahead through the drafts so far), so their drafts are accepted as well.

Each draft is then replaced by a wrong token with probability `wrong_fraction` (its own seeded
generator). With `wrong_fraction = 0` every draft of a greedy request is accepted, which exercises
long accepted runs and stops inside them; a fraction sets the acceptance rate to measure
verification. Stochastic requests see these drafts as deterministic (one-hot q), so their outputs
stay exact samples of the target.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from ninfer.engine.plan import DecodeRow, SlotOp
from ninfer.engine.sampler import advance_drafts, draft_masked, rewind
from ninfer.engine.speculative.mtp import Proposal
from ninfer.engine.speculative.rejection import greedy_token, plain_greedy
from ninfer.engine.step_io import StepOut, StepRows


class OracleDrafter:
    name = "oracle"

    def __init__(
        self,
        scratch_slots: Callable[[int], tuple[int, ...]],
        vocab: int,
        wrong_fraction: float,
        seed: int = 0,
        vocab_limit: int | None = None,
    ) -> None:
        if not 0.0 <= wrong_fraction <= 1.0:
            raise ValueError(f"spec_oracle_wrong_fraction must be in [0, 1], got {wrong_fraction}")
        self.scratch_slots = scratch_slots  # live slot -> the lane's k scratch slots
        self.wrong_fraction = wrong_fraction
        self.rng = random.Random(seed)
        self.vocab = vocab if vocab_limit is None else min(vocab, vocab_limit)
        self._forward: Callable[[StepRows], StepOut] | None = None

    def bind(self, forward: Callable[[StepRows], StepOut]) -> None:
        """The runner's target forward: (B, k+1) forwards replay its verify graphs when captured."""
        self._forward = forward

    def lane_state(self) -> tuple[list[Any], None]:
        """Nothing per lane: the oracle drafts from the target itself."""
        return [], None

    def slot_op(self, op: SlotOp) -> None:
        """Keeps no per-slot state."""

    def after_forward(
        self,
        slot: int,
        start: int,
        tokens: list[int],
        hidden: torch.Tensor,
        rope: torch.Tensor,
        pages: list[int],
        catch_up: bool,
    ) -> None:
        """Keeps no per-slot state."""

    def propose(self, rows: list[DecodeRow], k: int) -> list[Proposal]:
        if self._forward is None:
            raise RuntimeError("OracleDrafter has no target forward: bind() it to the runner's")
        # the state after token t goes to scratch[t]; the last token's also to scratch[k-1], not the live slot
        writes = [[*s[:k], s[k - 1]] for s in (self.scratch_slots(r.slot) for r in rows)]
        drafts: list[list[int]] = [[] for _ in rows]
        samplers = [r.sampler for r in rows]
        greedy_rows = any(plain_greedy(s) for s in samplers)
        try:
            for j in range(k):
                inputs = [
                    [r.token, *d] + [d[-1] if d else r.token] * (k - len(d))
                    for r, d in zip(rows, drafts, strict=True)
                ]
                out = self._forward(StepRows.for_decode(rows, inputs, writes))  # logits [B, k+1, V]
                raw = out.logits[:, j]  # [B, V]
                logits = draft_masked(raw, samplers)  # constrained rows: the mask verification applies here
                top = out.greedy() if greedy_rows else []  # [B][k+1]
                masked = logits.argmax(-1).tolist() if greedy_rows and logits is not raw else None
                for i, s in enumerate(samplers):
                    if not plain_greedy(s):
                        t = greedy_token(s, logits[i], drafts[i])
                    elif masked is not None and s.constraint is not None:
                        t = masked[i]
                    else:
                        t = top[i][j]
                    drafts[i].append(t)
                advance_drafts(samplers, [d[-1] for d in drafts])
        finally:
            rewind(samplers)
        return [Proposal([self._maybe_wrong(t) for t in d], None) for d in drafts]

    def _maybe_wrong(self, token: int) -> int:
        if self.wrong_fraction > 0 and self.rng.random() < self.wrong_fraction:
            return (token + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
        return token
