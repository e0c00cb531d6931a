"""One speculative decode round for every decode-ready request: draft -> verify -> accept, then the
state fix-up once the engine knows how many tokens each row committed.

GDN state rollback is "recompute on rollback" (kernels-notes §2.3): before verification each row's
live slot is copied into its lane's snapshot slot; verification runs the k+1 tokens
[t_last, d_1..d_k] on the live slot. A row that commits all k+1 tokens keeps that state. A row that
commits n < k+1 (a rejected draft, or a stop / length limit inside the accepted run) gets its
snapshot back and its first n inputs re-run (batched by n), so the live slot, the KV pages and the
lane ledger again describe exactly the committed tokens. Cost: one state copy per row and round,
plus one extra target forward of n tokens for rows that did not commit every token. KV rows past
the committed prefix are left behind and overwritten later (cache_lens governs).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ninfer.engine.pages import PAGE
from ninfer.engine.plan import DecodePlan, DecodeRow, SlotOp, StepResult
from ninfer.engine.sampler import sample_rows
from ninfer.engine.spec.mtp import Proposal, mask_vocab, rope_positions
from ninfer.engine.spec.rejection import match_greedy, plain_greedy, verify
from ninfer.model.cache import KVPool, StatePool, make_batch


class Drafter(Protocol):
    """What the decoder needs of a draft source (MTP or the oracle)."""

    name: str

    def slot_op(self, op: SlotOp) -> None: ...

    def after_forward(
        self,
        slot: int,
        start: int,
        tokens: list[int],
        hidden: torch.Tensor,
        rope: torch.Tensor,
        pages: list[int],
        catch_up: bool,
    ) -> None: ...

    def propose(self, rows: list[DecodeRow], k: int) -> list[Proposal]: ...


@dataclass
class SpecRound:
    """Per row of a decode plan: the tokens offered for commit (`runs`), drafts verified (0 for a
    plain fallback step) and drafts accepted. `finalize(committed)` must be called once the engine
    has committed: committed[i] = tokens row i committed, or None when its state is not retained."""

    runs: list[list[int]]
    drafted: list[int]
    accepted: list[int]
    device: torch.device
    _finalize: Callable[[list[int | None]], None] = field(repr=False)

    def finalize(self, committed: list[int | None]) -> float:
        """Bring every retained row's state to its committed tokens; returns the seconds spent."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            self._finalize(committed)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0


class SpecDecoder:
    """Runs decode plans speculatively with `k` drafts per row."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv: KVPool,
        states: StatePool,
        drafter: Drafter,
        k: int,
        snapshot_slot: Callable[[int], int],
        max_pages: int,
        device: torch.device,
        vocab_limit: int | None = None,
    ) -> None:
        self.model, self.kv, self.states = model, kv, states
        self.drafter = drafter
        self.k = k
        self.snapshot_slot = snapshot_slot
        self.max_pages = max_pages
        self.device = device
        self.vocab_limit = vocab_limit

    @property
    def backend(self) -> str:
        return self.drafter.name

    # ----- hooks the runner calls on every path -----
    def slot_op(self, op: SlotOp) -> None:
        self.drafter.slot_op(op)

    def after_prefill(
        self,
        slot: int,
        start: int,
        tokens: list[int],
        hidden: torch.Tensor,
        rope: torch.Tensor,
        pages: list[int],
    ) -> None:
        """A prefill chunk fed into `slot` at cache positions start..; hidden: [q, H], rope: [3, q]."""
        self.drafter.after_forward(slot, start, tokens, hidden, rope, pages, catch_up=True)

    # ----- the decode round -----
    def _rope(self, r: DecodeRow, q: int) -> torch.Tensor:
        """[3, q] rotary positions of q tokens fed from r.position (multimodal prompts: + rope_delta)."""
        return rope_positions([r.position + r.rope_delta], q, self.device)[:, 0]

    def _forward(self, rows: list[DecodeRow], inputs: list[list[int]]) -> torch.Tensor:
        q = len(inputs[0])
        batch = make_batch(
            inputs, [r.position for r in rows], [r.slot for r in rows], [r.pages for r in rows],
            self.max_pages, self.device,
            positions=rope_positions([r.position + r.rope_delta for r in rows], q, self.device),
        )  # fmt: skip
        return self.model(batch, self.kv, self.states)  # [B, q, H]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return mask_vocab(self.model.logits(hidden), self.vocab_limit)

    def decode(self, plan: DecodePlan) -> StepResult:
        rows, k = plan.rows, self.k
        n = len(rows)
        runs: list[list[int]] = [[] for _ in rows]
        drafted, accepted = [0] * n, [0] * n
        spec = [i for i, r in enumerate(rows) if r.position + k + 1 <= len(r.pages) * PAGE]
        plain = [i for i in range(n) if i not in set(spec)]
        if plain:  # too close to the end of its pages for k+1 KV rows: one ordinary step
            prow = [rows[i] for i in plain]
            hidden = self._forward(prow, [[r.token] for r in prow])  # [P, 1, H]
            tokens = sample_rows(self._logits(hidden[:, -1]), [r.sampler for r in prow])
            for j, (i, r) in enumerate(zip(plain, prow, strict=True)):
                runs[i] = [tokens[j]]
                self.drafter.after_forward(
                    r.slot, r.position, [r.token], hidden[j], self._rope(r, 1), r.pages, catch_up=False
                )
        srows = [rows[i] for i in spec]
        inputs: list[list[int]] = []
        hidden = torch.empty(0)
        if srows:
            proposals = self.drafter.propose(srows, k)
            for r in srows:
                self.states.copy_slot(r.slot, self.snapshot_slot(r.slot))
            inputs = [[r.token, *p.tokens] for r, p in zip(srows, proposals, strict=True)]
            hidden = self._forward(srows, inputs)  # [S, k+1, H]
            logits = self._logits(hidden)  # [S, k+1, V]
            argmax = logits.argmax(-1).tolist()  # [S][k+1], one transfer for the plain greedy rows
            for j, (i, r, p) in enumerate(zip(spec, srows, proposals, strict=True)):
                if plain_greedy(r.sampler):
                    verdict = match_greedy(argmax[j], p.tokens)
                else:
                    verdict = verify(r.sampler, logits[j], p.tokens, p.probs)
                runs[i], drafted[i], accepted[i] = verdict.tokens, k, verdict.accepted

        def finalize(committed: list[int | None]) -> None:
            redo: dict[int, list[int]] = defaultdict(list)
            for j, i in enumerate(spec):
                c, r = committed[i], srows[j]
                if c is None:
                    continue
                if not 1 <= c <= len(runs[i]):
                    raise ValueError(f"row {i}: {c} tokens committed of a run of {len(runs[i])}")
                if c == k + 1:
                    self.drafter.after_forward(
                        r.slot,
                        r.position,
                        inputs[j],
                        hidden[j],
                        self._rope(r, k + 1),
                        r.pages,
                        catch_up=False,
                    )
                else:
                    self.states.copy_slot(self.snapshot_slot(r.slot), r.slot)
                    redo[c].append(j)
            for c, js in redo.items():  # recompute the committed prefix from the snapshot
                rrows = [srows[j] for j in js]
                again = self._forward(rrows, [inputs[j][:c] for j in js])  # [G, c, H]
                for t, (j, r) in enumerate(zip(js, rrows, strict=True)):
                    self.drafter.after_forward(
                        r.slot, r.position, inputs[j][:c], again[t], self._rope(r, c), r.pages, catch_up=False
                    )

        return StepResult(
            seq_ids=[r.seq_id for r in rows],
            tokens=[run[0] for run in runs],
            spec=SpecRound(runs, drafted, accepted, self.device, finalize),
        )
