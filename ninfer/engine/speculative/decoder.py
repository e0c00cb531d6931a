"""One speculative decode round for every decode-ready request: draft -> verify -> accept, then the
state fix-up once the engine knows how many tokens each row committed.

GDN state rollback is "one slot per draft position": each lane owns k scratch
slots besides its live slot. Verification feeds the k+1 tokens [t_last, d_1..d_k] reading the live
slot and writes the state after input t (t = 0..k-1) into scratch[t] and the state after input k
into the live slot (`ForwardBatch.write_slots`). The Triton gdn_step / conv_step kernels load each
program's whole state tile (ssm: one [dk, block_v] tile of one head; conv: the K-1 window of one
channel block) into registers before their first store, and the torch references read every row
before writing, so writing the read slot last is safe. A row that commits all k+1 tokens keeps the
live state; a row that commits c < k+1 (a rejected draft, or a stop / length limit inside the
accepted run) gets scratch[c-1] copied into its live slot: one slot copy, no snapshot and no second
forward. KV rows past the committed prefix are left behind and overwritten later (cache_lens governs).

Grammar-constrained rows are verified on masked logits: position j carries the mask the plain path
would apply after the row's drafts d_1..d_j were committed (`sampler.run_masked`: the constraint
looks ahead through the drafts, then rewinds), so a draft the grammar refuses ends acceptance there
and greedy output equals spec off. The constraint stays at the committed state; the engine's commit
advances it through the committed tokens as on the plain path. Rows without a constraint are not
touched.

Every target forward goes through the runner's `forward` (bound at construction): a CUDA graph
replay per (batch, q) when captured, else eager. Hidden rows handed to the drafter may be views of
a static graph buffer that the next replay of the same q overwrites: a drafter copies what it keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ninfer.engine.graphs import StepGraphs
from ninfer.engine.pages import PAGE
from ninfer.engine.plan import DecodePlan, DecodeRow, SlotOp, StepResult
from ninfer.engine.sampler import run_masked, sample_with_logprobs
from ninfer.engine.speculative.mtp import Proposal, rope_positions
from ninfer.engine.speculative.rejection import match_greedy, plain_greedy, run_logprobs, verify
from ninfer.engine.step_io import StepOut, StepRows
from ninfer.engine.types import TokenLogprob
from ninfer.model.cache import KVPool, StatePool

Forward = Callable[[StepRows], StepOut]


class Drafter(Protocol):
    """What the decoder needs of a draft source (MTP or the oracle)."""

    name: str

    def lane_state(self) -> tuple[list[Any], Any]:
        """(KV pools on the lane's page ids, the per-slot pending holder or None) that a cold-tier
        image of a lane carries besides the trunk's pools."""
        ...

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


def copy_slots(states: StatePool, pairs: list[tuple[int, int]]) -> None:
    """Copy GDN state slot src -> dst for every (src, dst) pair: one fused multi-tensor copy over
    every layer's conv and ssm rows instead of two copies per layer and pair."""
    if not pairs:
        return
    dst: list[torch.Tensor] = []
    src: list[torch.Tensor] = []
    for pool in (*states.conv, *states.ssm):  # each [num_slots, ...]
        for s, d in pairs:
            src.append(pool[s])
            dst.append(pool[d])
    torch._foreach_copy_(dst, src)


@dataclass
class Unsettled:
    """A verified round's state fix-up, left for `SpecDecoder.settle` once its tokens are
    committed: per verified row j (plan row spec[j]), its lane's scratch slots, the k + 1 inputs
    fed and their hidden rows [S, k+1, H] (a view the next replay of the same q overwrites: the
    fix-up runs before the next step)."""

    result: StepResult  # the round's result: settled only with it
    spec: list[int]  # plan rows verified, in verify-batch order
    rows: list[DecodeRow]  # [S] those rows
    scratch: list[tuple[int, ...]]  # [S] each lane's k scratch slots
    inputs: list[list[int]]  # [S][k+1] tokens fed: [t_last, d_1..d_k]
    hidden: torch.Tensor  # [S, k+1, H]


class SpecDecoder:
    """Runs decode plans speculatively with `k` drafts per row.

    scratch_slots(live_slot) -> the lane's k scratch slots (k per lane, allocated at startup).
    `graphable`: whether the runner may capture graphs for this decoder's forwards (the DFlash
    drafter reads target features through forward hooks, which a graph replay does not run).
    """

    def __init__(
        self,
        kv: KVPool,
        states: StatePool,
        drafter: Drafter,
        k: int,
        scratch_slots: Callable[[int], tuple[int, ...]],
        device: torch.device,
        graphable: bool = True,
    ) -> None:
        self.kv, self.states = kv, states
        self.drafter = drafter
        self.k = k
        self.scratch_slots = scratch_slots
        self.device = device
        self.graphable = graphable
        self._forward: Forward | None = None
        self._unsettled: Unsettled | None = None  # the last round's fix-up, until `settle`

    @property
    def backend(self) -> str:
        return self.drafter.name

    def bind(self, forward: Forward) -> None:
        """The runner's target forward (graph replay or eager); drafters that run the target
        (the oracle) get it too."""
        self._forward = forward
        bind = getattr(self.drafter, "bind", None)
        if bind is not None:
            bind(forward)

    def add_graphs(self, manager: StepGraphs) -> None:
        """Let the drafter add its graphs (the MTP proposal) to the runner's step graph manager."""
        add = getattr(self.drafter, "add_graphs", None)
        if add is not None:
            add(manager)

    def forward(self, rows: StepRows) -> StepOut:
        if self._forward is None:
            raise RuntimeError("SpecDecoder has no target forward: construct the Runner with spec=")
        return self._forward(rows)

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
    def _ropes(self, rows: list[DecodeRow], q: int) -> torch.Tensor:
        """[3, B, q] rotary positions of q tokens fed from each row's position (multimodal prompts:
        + rope_delta), in one host->device copy; row j's first c are `[:, j, :c]`."""
        return rope_positions([r.cached + r.rope_delta for r in rows], q, self.device)

    def decode(self, plan: DecodePlan) -> StepResult:
        rows, k = plan.rows, self.k
        n = len(rows)
        runs: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[TokenLogprob] | None] = [None] * n
        drafted, accepted = [0] * n, [0] * n
        spec = [i for i, r in enumerate(rows) if r.cached + k + 1 <= len(r.pages) * PAGE]
        chosen = set(spec)
        plain = [i for i in range(n) if i not in chosen]
        if plain:  # too close to the end of its pages for k+1 KV rows: one ordinary step
            prow = [rows[i] for i in plain]
            out = self.forward(StepRows.for_decode(prow, [[r.token] for r in prow]))  # hidden [P, 1, H]
            tokens, lps = sample_with_logprobs(
                out.logits[:, -1], [r.sampler for r in prow], out.last_argmax()
            )
            ropes = self._ropes(prow, 1)  # [3, P, 1]
            for j, (i, r) in enumerate(zip(plain, prow, strict=True)):
                runs[i] = [tokens[j]]
                lp = None if lps is None else lps[j]
                logprobs[i] = None if lp is None else [lp]
                self.drafter.after_forward(
                    r.slot, r.cached, [r.token], out.hidden[j], ropes[:, j], r.pages, catch_up=False
                )
        srows = [rows[i] for i in spec]
        inputs: list[list[int]] = []
        scratch = [self.scratch_slots(r.slot) for r in srows]
        hidden = torch.empty(0)
        if srows:
            proposals = self.drafter.propose(srows, k)
            inputs = [[r.token, *p.tokens] for r, p in zip(srows, proposals, strict=True)]
            writes = [[*s[:k], r.slot] for r, s in zip(srows, scratch, strict=True)]
            out = self.forward(
                StepRows.for_decode(srows, inputs, writes)
            )  # hidden [S, k+1, H], logits [S, k+1, V]
            hidden = out.hidden
            samplers = [r.sampler for r in srows]
            # constrained rows: their logits under the mask of each position (host work while the GPU runs)
            crows, masked = run_masked(out.logits, samplers, [p.tokens for p in proposals])
            at = {j: c for c, j in enumerate(crows)}
            greedy: list[list[int]] = []
            verified: list[torch.Tensor] = []  # per row: the [k+1, V] logits its tokens come from
            if any(plain_greedy(s) for s in samplers):
                top = out.argmax if out.argmax is not None else out.logits.argmax(-1)  # [S, k+1]
                if crows:  # the masked rows' choices, in the same transfer
                    top = torch.cat([top, masked.argmax(-1)])
                greedy = top.tolist()
            for j, (i, r, p) in enumerate(zip(spec, srows, proposals, strict=True)):
                c = at.get(j)
                verified.append(out.logits[j] if c is None else masked[c])  # [k+1, V]
                if plain_greedy(r.sampler):
                    verdict = match_greedy(greedy[j if c is None else len(srows) + c], p.tokens)
                else:
                    verdict = verify(r.sampler, verified[j], p.tokens, p.probs)
                runs[i], drafted[i], accepted[i] = verdict.tokens, k, verdict.accepted
            for i, reported in zip(
                spec, run_logprobs(samplers, verified, [runs[i] for i in spec]), strict=True
            ):
                logprobs[i] = reported

        ids = [r.seq_id for r in rows]
        result = StepResult(ids, runs, logprobs=logprobs, drafted=drafted, accepted=accepted)
        self._unsettled = Unsettled(result, spec, srows, scratch, inputs, hidden)
        return result

    def settle(self, result: StepResult, committed: list[int | None]) -> bool:
        """Bring every retained row of `result`'s round to its committed tokens: committed[i] =
        tokens plan row i committed, or None when its state is not retained. False when `result`
        is not the round left unsettled (nothing to do)."""
        u, k = self._unsettled, self.k
        if u is None or u.result is not result:
            return False
        self._unsettled = None
        copies: list[tuple[int, int]] = []
        kept: list[tuple[int, int]] = []  # (row of the verify batch, committed tokens)
        for j, i in enumerate(u.spec):
            c = committed[i]
            if c is None:
                continue
            if not 1 <= c <= len(result.runs[i]):
                raise ValueError(f"row {i}: {c} tokens committed of a run of {len(result.runs[i])}")
            if c < k + 1:  # the state after input c-1 was written to scratch[c-1]
                copies.append((u.scratch[j][c - 1], u.rows[j].slot))
            kept.append((j, c))
        copy_slots(self.states, copies)
        ropes = self._ropes(u.rows, k + 1) if kept else None  # [3, S, k+1]
        for j, c in kept:
            r = u.rows[j]
            self.drafter.after_forward(
                r.slot,
                r.cached,
                u.inputs[j][:c],
                u.hidden[j, :c],
                ropes[:, j, :c],  # type: ignore[index]
                r.pages,
                catch_up=False,
            )
        return True
