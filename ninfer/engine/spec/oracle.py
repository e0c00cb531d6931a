"""Oracle drafter, a testing and benchmarking aid: drafts are the target's own greedy continuation.

It runs k plain target decode steps on a scratch copy of each row's GDN state (so its cost is
k target forwards, not an MTP's: time it separately), then replaces each draft by a wrong token
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
from ninfer.engine.spec.mtp import Proposal, mask_vocab, rope_positions
from ninfer.engine.spec.rejection import greedy_token
from ninfer.model.cache import KVPool, StatePool, make_batch


class OracleDrafter:
    name = "oracle"

    def __init__(
        self,
        model: torch.nn.Module,
        kv: KVPool,
        states: StatePool,
        scratch_slot: Callable[[int], int],
        max_pages: int,
        device: torch.device,
        wrong_fraction: float,
        seed: int = 0,
        vocab_limit: int | None = None,
    ) -> None:
        if not 0.0 <= wrong_fraction <= 1.0:
            raise ValueError(f"spec_oracle_wrong_fraction must be in [0, 1], got {wrong_fraction}")
        self.model, self.kv, self.states = model, kv, states
        self.scratch_slot = scratch_slot
        self.max_pages = max_pages
        self.device = device
        self.wrong_fraction = wrong_fraction
        self.rng = random.Random(seed)
        vocab = model.config.vocab_size
        self.vocab = vocab if vocab_limit is None else min(vocab, vocab_limit)
        self.vocab_limit = vocab_limit

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
        scratch = [self.scratch_slot(r.slot) for r in rows]
        for r, s in zip(rows, scratch, strict=True):
            self.states.copy_slot(r.slot, s)
        drafts: list[list[int]] = [[] for _ in rows]
        last = [r.token for r in rows]
        for j in range(k):
            batch = make_batch(
                [[t] for t in last],
                [r.position + j for r in rows],
                scratch,
                [r.pages for r in rows],
                self.max_pages,
                self.device,
                positions=rope_positions([r.position + r.rope_delta + j for r in rows], 1, self.device),
            )
            hidden = self.model(batch, self.kv, self.states)[:, -1]  # [B, H]
            logits = mask_vocab(self.model.logits(hidden), self.vocab_limit)  # [B, V]
            last = [greedy_token(r.sampler, logits[i], drafts[i]) for i, r in enumerate(rows)]
            for d, t in zip(drafts, last, strict=True):
                d.append(t)
        out = []
        for d in drafts:
            shown = [self._maybe_wrong(t) for t in d]
            out.append(Proposal(shown, None))
        return out

    def _maybe_wrong(self, token: int) -> int:
        if self.wrong_fraction > 0 and self.rng.random() < self.wrong_fraction:
            return (token + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
        return token
