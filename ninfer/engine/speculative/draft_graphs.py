"""The MTP drafter's whole greedy proposal (k drafts in one replay) as a graph family of the step
graph manager (`graphs.StepGraphs.add_family`, name "draft"), per batch size: this module builds
each size's static inputs and step, packs the lanes and reads the drafts; the manager captures,
pools, accounts and replays the graphs with the step's own.

One replay per round: the first step over every lane's pending rows, padded to a static m = k + 1
rows per lane, the MTP hidden picked at each lane's own last real row (a device gather by index),
then k - 1 steps of [B, 1] fed by the in-graph argmax of the previous draft's logits. The drafts
land in a static [B, k] int64 buffer: one host transfer per round.

Padding rows are harmless. A lane with n < m pending rows (positions start..start+n-1, the last one
at r.position - 1) feeds m - n padding rows at positions r.position .. r.position + m - n - 1
<= r.position + k. Within the first step they come after the lane's real rows, so no real row
attends to them (causal). Draft step j writes its own entry at r.position + j and attends only to
positions <= r.position + j, all written earlier in this replay by real rows or by the draft steps
themselves. The next round's first step starts its real rows at this round's r.position (the
drafter's pending start) and so rewrites every such position before any query sees it. The
positions lie inside the lane's pages: the replay is only used for rows with
r.position + k + 1 <= pages * 64, as the speculative decoder requires of every verified row.
Padding rows carry token 0, hidden zeros and rotary position 0: finite, so their K/V are finite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ninfer.engine.graphs import FamilyStats, StepGraphs
from ninfer.engine.step_io import host_buffer
from ninfer.model.cache import ForwardBatch, KVPool
from ninfer.model.config import PAGE_SIZE

DRAFT = "draft"  # the family's name in the manager and in `GraphStats.families`

GreedyFn = Callable[[torch.Tensor], torch.Tensor]  # MTP hidden [B, H] -> draft token ids [B] int64


@dataclass(frozen=True)
class DraftLane:
    """One lane of a graphed proposal (host data; hidden and rope stay on the device)."""

    tokens: Sequence[int]  # the n pending inputs: pending tokens[1:] + the newest committed token
    start: int  # the first pending position
    position: int  # the newest committed token's position (= start + n)
    rope_delta: int  # draft steps' rotary positions: position + rope_delta + j
    pages: Sequence[int]
    hidden: torch.Tensor  # [n, H] the pending rows' trunk hidden (model dtype)
    rope: torch.Tensor  # [3, n] their rotary positions (int64)


def packed_len(b: int, m: int, max_pages: int) -> int:
    """int64 words: ids B*m | starts B | last rows B | positions B | rope bases B | page table
    B*max_pages int32 (two per word)."""
    return b * m + 4 * b + -(-b * max_pages // 2)


class DraftFamily:
    """The greedy proposal of k drafts per exact batch size, captured by the step graph manager."""

    def __init__(
        self,
        mtp: torch.nn.Module,
        kv: KVPool,
        greedy: GreedyFn,
        k: int,
        max_batch: int,
        max_pages: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        manager: StepGraphs,
    ) -> None:
        if k < 1:
            raise ValueError(f"draft graphs need k >= 1, got {k}")
        self.mtp, self.kv, self.greedy = mtp, kv, greedy
        self.k, self.m = k, k + 1
        self.max_batch, self.max_pages = max_batch, max_pages
        self.device, self.manager = device, manager
        self.hidden = torch.zeros(max_batch * self.m, hidden_size, dtype=dtype, device=device)  # [Bmax*m, H]
        self.drafts = torch.zeros(max_batch, k, dtype=torch.int64, device=device)  # [Bmax, k]
        self._pad_hidden = torch.zeros(self.m, hidden_size, dtype=dtype, device=device)  # [m, H]
        self._pad_rope = torch.zeros(3, self.m, dtype=torch.int64, device=device)  # [3, m]
        self._rows = torch.arange(max_batch, device=device)  # [Bmax]
        self._zeros = torch.zeros(max_batch, dtype=torch.int64, device=device)  # [Bmax] unused GDN slots
        self.static: dict[int, torch.Tensor] = {}  # B -> device [packed_len(B, m, max_pages)]
        self.rope: dict[int, torch.Tensor] = {}  # B -> device [3, B, m]
        self._cut: Callable[[], None] | None = None  # set while capturing: one graph per draft step

    def has(self, b: int) -> bool:
        return self.manager.has_family(DRAFT, b)

    @property
    def captured(self) -> bool:
        return self.manager.has_family(DRAFT)

    @property
    def stats(self) -> FamilyStats | None:
        """The family's capture in the manager's stats (None before its capture)."""
        return self.manager.family_stats.get(DRAFT)

    def fits(self, lane: DraftLane) -> bool:
        """Whether the replay serves this lane: 1..m pending rows, pages for position + k + 1."""
        n = len(lane.tokens)
        return 1 <= n <= self.m and lane.position + self.k + 1 <= len(lane.pages) * PAGE_SIZE

    # ----- capture (by the manager) -----
    def register(self, sizes: Iterable[int] | None = None) -> None:
        """Add every size (default 1..max_batch) to the manager's capture. Its warm-up runs write
        scratch MTP K/V into page 0: the manager captures before any sequence exists."""
        order = sorted(set(range(1, self.max_batch + 1) if sizes is None else sizes), reverse=True)
        if order and not 1 <= order[-1] <= order[0] <= self.max_batch:
            raise ValueError(f"batch sizes must lie in 1..{self.max_batch}, got {order}")
        self.manager.add_family(DRAFT, order, self._build, self._install_cut)

    def _build(self, b: int) -> Callable[[], None]:
        """The batch-b proposal over its static inputs (scratch: every lane on page 0)."""
        m, k, mp = self.m, self.k, self.max_pages
        flat = torch.zeros(packed_len(b, m, mp), dtype=torch.int64, device=self.device)
        n = b * m
        table = flat[n + 4 * b :].view(torch.int32)[: b * mp].view(b, mp)  # [B, max_pages]
        table.fill_(-1)
        table[:, 0] = 0  # scratch: every lane on page 0, positions 0..m-1
        flat[n + b : n + 2 * b].fill_(m - 1)  # last rows
        rope = torch.zeros(3, b, m, dtype=torch.int64, device=self.device)  # [3, B, m]
        rope[:] = torch.arange(m, device=self.device)
        ids = flat[:n].view(b, m)  # [B, m]
        starts, last = flat[n : n + b], flat[n + b : n + 2 * b]  # [B], [B]
        positions, rope_base = flat[n + 2 * b : n + 3 * b], flat[n + 3 * b : n + 4 * b]  # [B], [B]
        hidden = self.hidden[:n].view(b, m, -1)  # [B, m, H]
        drafts, rows, slots = self.drafts[:b], self._rows[:b], self._zeros[:b]
        self.static[b] = flat
        self.rope[b] = rope

        def fn() -> None:
            first = ForwardBatch(ids, rope, slots, table, starts)  # max_kv_len None: static width
            x = self.mtp(first, hidden, self.kv)[rows, last]  # [B, H] at each lane's last real row
            for j in range(k):
                tok = self.greedy(x)  # [B] int64
                drafts[:, j] = tok
                if j == k - 1:
                    break
                if self._cut is not None:  # the next step's graph launches while this one runs
                    self._cut()
                pos = (rope_base + j)[None, :, None].expand(3, b, 1).contiguous()  # [3, B, 1]
                step = ForwardBatch(tok[:, None], pos, slots, table, positions + j)
                x = self.mtp(step, x[:, None], self.kv)[:, 0]  # [B, H]

        return fn

    def _install_cut(self, cut: Callable[[], None] | None) -> None:
        self._cut = cut

    # ----- replay -----
    def replay(self, b: int) -> None:
        """Replay the batch-b proposal on the inputs it last received (timing; no host work)."""
        self.manager.replay_family(DRAFT, b)

    @torch.inference_mode()
    def run(self, lanes: Sequence[DraftLane]) -> list[list[int]]:
        """k greedy drafts per lane (every lane must `fit`); one host transfer."""
        b, m, mp = len(lanes), self.m, self.max_pages
        if not self.has(b):
            raise ValueError(f"no draft graph for batch size {b}")
        n = b * m
        host = host_buffer(packed_len(b, m, mp), self.device)
        a = host.numpy()  # a view: numpy element writes are far cheaper than torch's
        ids = a[:n].reshape(b, m)
        ids.fill(0)
        table = a[n + 4 * b :].view(np.int32)[: b * mp].reshape(b, mp)
        table.fill(-1)
        hid: list[torch.Tensor] = []
        rope: list[torch.Tensor] = []
        for i, lane in enumerate(lanes):
            if not self.fits(lane):
                raise ValueError(f"lane {i} does not fit the draft graph (k={self.k})")
            c = len(lane.tokens)
            ids[i, :c] = lane.tokens
            a[n + i] = lane.start
            a[n + b + i] = c - 1
            a[n + 2 * b + i] = lane.position
            a[n + 3 * b + i] = lane.position + lane.rope_delta
            table[i, : len(lane.pages)] = lane.pages
            hid += [lane.hidden, self._pad_hidden[: m - c]]
            rope += [lane.rope, self._pad_rope[:, : m - c]]
        self.static[b].copy_(host, non_blocking=True)
        torch.cat(hid, out=self.hidden[:n])  # [B*m, H]
        torch.cat(rope, dim=1, out=self.rope[b].view(3, n))  # [3, B*m]
        self.replay(b)
        return self.drafts[:b].tolist()
