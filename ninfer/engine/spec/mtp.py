"""The MTP drafter: the artifact's one MTP layer applied recursively, with its own one-layer KV pool.

Pairing (model-reference §4): MTP row i = (token i+1, position i, trunk hidden i). The MTP KV pool
has as many pages as the trunk's and is indexed by the request's own page ids, so it is retained,
reused and freed together with the trunk's KV (no allocator of its own).

Per GDN slot the drafter keeps `Pending` rows: the trunk positions whose MTP entry is not written
yet (their next token was not known when the trunk ran them), with their tokens and hidden rows.
Invariant: for a slot whose state covers n tokens, MTP entries [0, start) are valid and the pending
rows are positions start..n-1. Slot copies and resets (checkpoints, restores, full resets) mirror
the state pool's, so every retained state carries what the drafter needs to continue after it,
and a reused prefix needs no rebuild.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from ninfer.engine.plan import DecodeRow, SlotOp
from ninfer.engine.spec.draft_head import DraftHead
from ninfer.engine.spec.rejection import plain_greedy, propose
from ninfer.model.cache import KVPool, make_batch


@dataclass(frozen=True)
class Proposal:
    """k draft tokens of one row; `probs` [k, V] the draft distributions (None: deterministic drafts)."""

    tokens: list[int]
    probs: torch.Tensor | None


@dataclass(frozen=True)
class Pending:
    """Trunk positions start..start+m-1 whose MTP entries are still to be written."""

    start: int
    tokens: tuple[int, ...] = ()  # the tokens fed at those positions
    hidden: torch.Tensor | None = None  # [m, H] their trunk hidden rows (after the final norm)
    rope: torch.Tensor | None = None  # [3, m] their rotary positions (T/H/W streams, as the trunk's)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


EMPTY = Pending(0)


def rope_positions(firsts: list[int], q: int, device: torch.device) -> torch.Tensor:
    """Text rotary positions: row b holds firsts[b] + 0..q-1 on all three streams. -> [3, B, q]"""
    pos = torch.tensor(firsts, dtype=torch.int64)[:, None] + torch.arange(q)  # [B, q]
    return pos.unsqueeze(0).expand(3, -1, -1).contiguous().to(device)


def _cat(a: torch.Tensor | None, b: torch.Tensor, dim: int) -> torch.Tensor:
    return b if a is None else torch.cat([a, b], dim=dim)


def mask_vocab(logits: torch.Tensor, vocab_limit: int | None) -> torch.Tensor:
    """Never propose padded embedding rows (ids >= vocab_limit)."""
    if vocab_limit is not None and vocab_limit < logits.shape[-1]:
        logits[..., vocab_limit:] = float("-inf")
    return logits


class MTPDrafter:
    name = "mtp"

    def __init__(
        self,
        model: torch.nn.Module,
        num_pages: int,
        num_slots: int,
        max_pages: int,
        dtype: torch.dtype,
        device: torch.device,
        head: DraftHead | None = None,
        vocab_limit: int | None = None,
    ) -> None:
        if getattr(model, "mtp", None) is None:
            raise ValueError("the model has no MTP head loaded")
        self.mtp = model.mtp
        self.kv = KVPool.for_config(model.config, num_pages, dtype, device, num_layers=1)
        self.pending: list[Pending] = [EMPTY] * num_slots
        self.max_pages = max_pages
        self.device = device
        self.head = head
        self.vocab_limit = vocab_limit

    # ----- state mirroring -----
    def slot_op(self, op: SlotOp) -> None:
        self.pending[op.dst] = EMPTY if op.src is None else self.pending[op.src]

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
        """The trunk fed `tokens` at cache positions start.. into `slot`; hidden: [q, H] their rows,
        rope: [3, q] their rotary positions. With `catch_up` (prefill), write every MTP entry whose
        next token is now known."""
        p = self.pending[slot]
        if p.end != start:
            raise RuntimeError(
                f"MTP drafter out of step on slot {slot}: pending ends at {p.end}, fed from {start}"
            )
        toks = p.tokens + tuple(tokens)
        hid = _cat(p.hidden, hidden, 0)  # [m + q, H]
        pos = _cat(p.rope, rope, 1)  # [3, m + q]
        rows = len(toks) - 1
        if not catch_up or rows == 0:
            self.pending[slot] = Pending(p.start, toks, hid, pos)
            return
        batch = make_batch(
            [list(toks[1:])],
            [p.start],
            [0],
            [pages],
            self.max_pages,
            self.device,
            positions=pos[:, None, :rows],
        )
        self.mtp(batch, hid[None, :rows], self.kv)
        self.pending[slot] = Pending(p.start + rows, toks[-1:], hid[-1:].clone(), pos[:, -1:].clone())

    # ----- drafting -----
    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """MTP hidden [B, H] -> float32 draft logits [B, V] (-inf outside a reduced head)."""
        logits = self.head.logits(x) if self.head is not None else self.mtp.logits(x)
        return mask_vocab(logits, self.vocab_limit)

    def _first_step(self, rows: list[DecodeRow]) -> torch.Tensor:
        """Write every pending entry (the newest committed token closes the last one). -> [B, H]."""
        out: list[torch.Tensor | None] = [None] * len(rows)
        groups: dict[int, list[int]] = defaultdict(list)
        for i, r in enumerate(rows):
            p = self.pending[r.slot]
            if p.end != r.position or not p.tokens:
                raise RuntimeError(f"MTP drafter out of step on slot {r.slot}: pending {p.start}..{p.end}")
            groups[len(p.tokens)].append(i)
        for idx in groups.values():
            ps = [self.pending[rows[i].slot] for i in idx]
            ids = [[*p.tokens[1:], rows[i].token] for p, i in zip(ps, idx, strict=True)]
            batch = make_batch(
                ids,
                [p.start for p in ps],
                [0] * len(idx),
                [rows[i].pages for i in idx],
                self.max_pages,
                self.device,
                positions=torch.stack([p.rope for p in ps], dim=1),  # [3, G, m]
            )
            hidden = torch.stack([p.hidden for p in ps])  # [G, m, H]
            h = self.mtp(batch, hidden, self.kv)[:, -1]  # [G, H]
            for j, i in enumerate(idx):
                out[i] = h[j]
                self.pending[rows[i].slot] = Pending(rows[i].position)
        return torch.stack(out)  # type: ignore[arg-type]

    def propose(self, rows: list[DecodeRow], k: int) -> list[Proposal]:
        """k drafts per row: step 1 from the trunk's hidden rows, steps 2..k from the MTP's own output."""
        x = self._first_step(rows)  # [B, H]
        drafts: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        for j in range(k):
            logits = self._logits(x)  # [B, V]
            argmax = logits.argmax(-1).tolist()  # one transfer for the plain greedy rows
            for i, r in enumerate(rows):
                if plain_greedy(r.sampler):
                    drafts[i].append(argmax[i])
                    continue
                d, q = propose(r.sampler, logits[i], drafts[i])
                drafts[i].append(d)
                if q is not None:
                    probs[i].append(q)
            if j == k - 1:
                break
            batch = make_batch(
                [[d[-1]] for d in drafts],
                [r.position + j for r in rows],
                [0] * len(rows),
                [r.pages for r in rows],
                self.max_pages,
                self.device,
                positions=rope_positions([r.position + r.rope_delta + j for r in rows], 1, self.device),
            )
            x = self.mtp(batch, x[:, None], self.kv)[:, 0]
        return [Proposal(d, torch.stack(q) if q else None) for d, q in zip(drafts, probs, strict=True)]
