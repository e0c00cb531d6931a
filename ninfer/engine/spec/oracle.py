"""Oracle drafter, a testing and benchmarking aid: drafts are the target's own greedy continuation.

It runs k plain target decode steps (the runner's q = 1 decode graphs when captured) on a scratch
copy of each row's GDN state (so its cost is k target forwards, not an MTP's: time it separately), then replaces each draft by a wrong token
with probability `wrong_fraction` (its own seeded generator). With `wrong_fraction = 0` every draft
of a greedy request is accepted, which exercises long accepted runs and stops inside them; a
fraction sets the acceptance rate to measure verification. Stochastic requests see these drafts
as deterministic (one-hot q), so their outputs stay exact samples of the target.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from ninfer.engine.plan import DecodeRow, SlotOp
from ninfer.engine.spec.decoder import copy_slots
from ninfer.engine.spec.mtp import Proposal
from ninfer.engine.spec.rejection import greedy_token, plain_greedy
from ninfer.engine.step_io import StepOut, StepRows
from ninfer.model.cache import StatePool


class OracleDrafter:
    name = "oracle"

    def __init__(
        self,
        states: StatePool,
        scratch_slot: Callable[[int], int],
        vocab: int,
        wrong_fraction: float,
        seed: int = 0,
        vocab_limit: int | None = None,
    ) -> None:
        if not 0.0 <= wrong_fraction <= 1.0:
            raise ValueError(f"spec_oracle_wrong_fraction must be in [0, 1], got {wrong_fraction}")
        self.states = states
        self.scratch_slot = scratch_slot
        self.wrong_fraction = wrong_fraction
        self.rng = random.Random(seed)
        self.vocab = vocab if vocab_limit is None else min(vocab, vocab_limit)
        self._forward: Callable[[StepRows], StepOut] | None = None

    def bind(self, forward: Callable[[StepRows], StepOut]) -> None:
        """The runner's target forward: q = 1 steps replay its decode graphs when captured."""
        self._forward = forward

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
        scratch = [self.scratch_slot(r.slot) for r in rows]
        copy_slots(self.states, [(r.slot, s) for r, s in zip(rows, scratch, strict=True)])
        drafts: list[list[int]] = [[] for _ in rows]
        last = [r.token for r in rows]
        offsets = [r.rope_delta for r in rows] if any(r.rope_delta for r in rows) else None
        for j in range(k):
            out = self._forward(
                StepRows(
                    [[t] for t in last],
                    [r.position + j for r in rows],
                    scratch,
                    [r.pages for r in rows],
                    offsets,
                )
            )
            logits = out.logits[:, -1]  # [B, V] float32, padded ids masked
            top = [g[-1] for g in out.greedy()] if any(plain_greedy(r.sampler) for r in rows) else []
            last = [
                top[i] if plain_greedy(r.sampler) else greedy_token(r.sampler, logits[i], drafts[i])
                for i, r in enumerate(rows)
            ]
            for d, t in zip(drafts, last, strict=True):
                d.append(t)
        out_p = []
        for d in drafts:
            shown = [self._maybe_wrong(t) for t in d]
            out_p.append(Proposal(shown, None))
        return out_p

    def _maybe_wrong(self, token: int) -> int:
        if self.wrong_fraction > 0 and self.rng.random() < self.wrong_fraction:
            return (token + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
        return token
