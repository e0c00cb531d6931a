"""The MTP drafter: the artifact's one MTP layer applied recursively, with its own one-layer KV pool.

Pairing: MTP row i = (token i+1, position i, trunk hidden i). The MTP KV pool
has as many pages as the trunk's and is indexed by the request's own page ids, so it is retained,
reused and freed together with the trunk's KV (no allocator of its own).

Per GDN slot the drafter keeps `Pending` rows: the trunk positions whose MTP entry is not written
yet (their next token was not known when the trunk ran them), with their tokens and hidden rows.
Invariant: for a slot whose state covers n tokens, MTP entries [0, start) are valid and the pending
rows are positions start..n-1. Slot copies and resets (checkpoints, restores, full resets) mirror
the state pool's, so every retained state carries what the drafter needs to continue after it,
and a reused prefix needs no rebuild. Pending hidden rows are the drafter's own device copies
(never views of a caller's buffer), shared by reference between slots and never written in place.

Plain greedy rounds replay one captured graph of the whole proposal (`draft_graphs.py`: a family
the drafter adds to the step graph manager, `add_graphs`, captured with the step's graphs); the eager
steps stay the reference and serve sampled rows. Constrained rows are drafted under their grammar
masks (`rejection.draft_step`: each draft position masked in the lookahead state after the drafts
before it, rewound at the end), which the graph cannot apply (a mask depends on the drafts it
computes): they take the eager steps, alone, while the round's other rows still replay the graph,
so a constrained row never costs the others the graph and never wastes a draft the grammar refuses.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass

import torch

from ninfer.engine.graphs import CaptureBackend, FamilyStats, StepGraphs
from ninfer.engine.plan import DecodeRow, SlotOp
from ninfer.engine.sampler import rewind
from ninfer.engine.speculative.draft_graphs import DraftFamily, DraftLane
from ninfer.engine.speculative.draft_head import DraftHead
from ninfer.engine.speculative.rejection import draft_step, plain_greedy
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
    hidden: torch.Tensor | None = None  # [m, H] their trunk hidden rows (after the final norm), owned
    rope: torch.Tensor | None = None  # [3, m] their rotary positions (T/H/W streams, as the trunk's)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


EMPTY = Pending(0)


def rope_positions(firsts: list[int], q: int, device: torch.device) -> torch.Tensor:
    """Text rotary positions: row b holds firsts[b] + 0..q-1 on all three streams. -> [3, B, q]"""
    pos = torch.tensor(firsts, dtype=torch.int64)[:, None] + torch.arange(q)  # [B, q]
    return pos.unsqueeze(0).expand(3, -1, -1).contiguous().to(device)


def _on(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """The device current while capturing (the calling thread may start on another GPU)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


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
        draft_tokens: int | None = None,
        max_batch: int = 1,
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
        self.draft_tokens = draft_tokens  # the k the draft graphs are captured for (None: no graphs)
        self.max_batch = max_batch
        self._family: DraftFamily | None = None

    @property
    def graphs(self) -> DraftFamily | None:
        """The proposal graphs, once captured (None: drafting runs the eager steps)."""
        family = self._family
        return family if family is not None and family.captured else None

    @property
    def graph_stats(self) -> FamilyStats | None:
        """What capturing the proposal graphs cost, or why they are off (None: not captured)."""
        return None if self._family is None else self._family.stats

    def add_graphs(self, manager: StepGraphs, sizes: list[int] | None = None) -> None:
        """Add the greedy proposal graphs (batch 1..max_batch, or `sizes`) to the step graph
        manager, which captures them with its own before any sequence exists (warm-up writes
        scratch MTP K/V into page 0). Nothing without a k (`draft_tokens`)."""
        if self.draft_tokens is None:
            return
        family = DraftFamily(
            self.mtp, self.kv, self._greedy, self.draft_tokens, self.max_batch, self.max_pages,
            self.mtp.config.hidden_size, self.mtp.norm.weight.dtype, self.device, manager,
        )  # fmt: skip
        family.register(sizes)
        self._family = family

    def capture_graphs(
        self, backend: CaptureBackend | None, sizes: list[int] | None = None
    ) -> FamilyStats | None:
        """Capture the proposal graphs alone, through a manager of this family only (benchmarks,
        tests; the engine's runner adds them to its own manager). Idempotent; a failed capture
        leaves drafting eager and says why in `graph_stats`."""
        if self.graph_stats is not None or backend is None or self.draft_tokens is None:
            return self.graph_stats
        manager = StepGraphs.families_only(backend, self.device)
        self.add_graphs(manager, sizes)
        with torch.inference_mode(), _on(self.device):
            manager.capture()
        return self.graph_stats

    # ----- state mirroring -----
    def lane_state(self) -> tuple[list[KVPool], MTPDrafter | None]:
        """What a parked lane image carries besides the trunk: the MTP KV on the lane's page ids and
        the pending rows per slot (this drafter)."""
        return [self.kv], self

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
        # `hidden` may view a static graph buffer that the next replay overwrites: keep a copy
        hid = hidden.clone() if p.hidden is None else torch.cat([p.hidden, hidden])  # [m + q, H]
        pos = rope.clone() if p.rope is None else torch.cat([p.rope, rope], dim=1)  # [3, m + q]
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

    def _greedy(self, x: torch.Tensor) -> torch.Tensor:
        """MTP hidden [B, H] -> [B] int64 greedy drafts (device ops only, graph-capturable)."""
        if self.head is not None:
            return self.head.greedy(x, self.vocab_limit)
        return self._logits(x).argmax(-1)

    def _graph_lanes(self, rows: list[DecodeRow], k: int) -> list[DraftLane] | None:
        """The rows as draft-graph lanes, or None when the eager path must run (a sampled or
        penalized row, another k, no graph of this size, more pending rows than k + 1)."""
        g = self.graphs
        if g is None or k != g.k or not g.has(len(rows)):
            return None
        lanes = []
        for r in rows:
            p = self.pending[r.slot]
            if not plain_greedy(r.sampler) or p.end != r.cached or p.hidden is None or p.rope is None:
                return None
            lane = DraftLane(
                (*p.tokens[1:], r.token), p.start, r.cached, r.rope_delta, r.pages, p.hidden, p.rope
            )
            if not g.fits(lane):
                return None
            lanes.append(lane)
        return lanes

    def _first_step(self, rows: list[DecodeRow]) -> torch.Tensor:
        """Write every pending entry (the newest committed token closes the last one). -> [B, H]."""
        out: list[torch.Tensor | None] = [None] * len(rows)
        groups: dict[int, list[int]] = defaultdict(list)
        for i, r in enumerate(rows):
            p = self.pending[r.slot]
            if p.end != r.cached or not p.tokens:
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
                self.pending[rows[i].slot] = Pending(rows[i].cached)
        return torch.stack(out)

    def propose(self, rows: list[DecodeRow], k: int) -> list[Proposal]:
        """k drafts per row: step 1 from the trunk's hidden rows, steps 2..k from the MTP's own output.
        All unconstrained rows plain greedy with at most k + 1 pending rows: one draft-graph replay
        of theirs, and the eager steps for the constrained rows (masked); otherwise the eager steps
        for every row (the reference, and the path of sampled rows)."""
        masked = [i for i, r in enumerate(rows) if r.sampler.constraint is not None]
        free = [i for i, r in enumerate(rows) if r.sampler.constraint is None]
        lanes = self._graph_lanes([rows[i] for i in free], k) if free else None
        if lanes is None or self.graphs is None:
            return self._eager(rows, k)
        out: list[Proposal | None] = [None] * len(rows)
        for i, d in zip(free, self.graphs.run(lanes), strict=True):
            self.pending[rows[i].slot] = Pending(rows[i].cached)
            out[i] = Proposal(d, None)
        if masked:
            for i, p in zip(masked, self._eager([rows[i] for i in masked], k), strict=True):
                out[i] = p
        return [p for p in out if p is not None]

    def _eager(self, rows: list[DecodeRow], k: int) -> list[Proposal]:
        """The proposal step by step: constrained rows masked, sampled rows with their distributions."""
        x = self._first_step(rows)  # [B, H]
        samplers = [r.sampler for r in rows]
        drafts: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        try:
            for j in range(k):
                draft_step(samplers, self._logits(x), drafts, probs)  # [B, V] logits
                if j == k - 1:
                    break
                batch = make_batch(
                    [[d[-1]] for d in drafts],
                    [r.cached + j for r in rows],
                    [0] * len(rows),
                    [r.pages for r in rows],
                    self.max_pages,
                    self.device,
                    positions=rope_positions([r.cached + r.rope_delta + j for r in rows], 1, self.device),
                )
                x = self.mtp(batch, x[:, None], self.kv)[:, 0]
        finally:
            rewind(samplers)  # constrained rows' lookahead back to their committed tokens
        return proposals(drafts, probs)


def proposals(drafts: list[list[int]], probs: list[list[torch.Tensor]]) -> list[Proposal]:
    """Per row its drafts, with the stacked draft distributions when they were sampled."""
    return [Proposal(d, torch.stack(q) if q else None) for d, q in zip(drafts, probs, strict=True)]
