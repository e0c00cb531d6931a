"""Generated-token counts on the device: presence and frequency penalties of a decode round
without the host reading the committed tokens.

Each lane (its live slot) owns one row of `counts` [rows, V] float32 (exact for any count a
context can reach). The row belongs to the request whose `RowSampler` last decoded on the lane:
at a request's first decode round it is rewritten from the sampler's committed counts (one
sparse upload, on the stream, without a sync); from then on every round adds its sampled tokens
on the device. So a round launched ahead of the commit of the one before sees exactly the
counts the host will have (a penalized row no longer keeps the engine from launching ahead), and
a token of a round whose request finished before it only touches a row the next request
rewrites. The penalized logits equal `sampler._penalized` bit for bit: the same float32
`count * frequency_penalty + presence_penalty` is subtracted where a count is positive, and a
count of zero subtracts nothing (`torch.where`), as the host's sparse update leaves those alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ninfer.engine.sampler import RowSampler, to_device

# (batch rows [P], count rows [P]) on the device: the penalized rows of a round, for `add`
Counted = tuple[torch.Tensor, torch.Tensor]


class PenalizedRow(Protocol):
    """What the counts read of a decode row (`plan.DecodeRow`)."""

    @property
    def slot(self) -> int: ...  # the lane's live GDN slot: one count row per lane
    @property
    def sampler(self) -> RowSampler: ...


class PenaltyCounts:
    """One float32 count row per lane, allocated at the first penalized round (`rows` lanes)."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.rows = rows
        self.device = device
        self.counts: torch.Tensor | None = None  # [rows, V] float32
        self._row_of: dict[int, int] = {}  # live slot -> count row
        self._owner: list[RowSampler | None] = [None] * rows  # strong refs: identity stays unique

    def penalize(
        self, logits: torch.Tensor, rows: Sequence[PenalizedRow]
    ) -> tuple[torch.Tensor, Counted | None]:
        """logits [B, V] float32 -> (the logits with each penalized row's penalties subtracted, the
        same tensor when no row is penalized; the rows to count this round's tokens into)."""
        which = [i for i, r in enumerate(rows) if r.sampler.penalized]
        if not which:
            return logits, None
        if self.counts is None:
            self.counts = torch.zeros(self.rows, logits.shape[1], dtype=torch.float32, device=self.device)
        count_rows = [self._claim(rows[i]) for i in which]
        knobs = torch.tensor(
            [[rows[i].sampler.params.frequency_penalty for i in which],
             [rows[i].sampler.params.presence_penalty for i in which]],
            dtype=torch.float32,
        )  # fmt: skip
        freq, pres = to_device(knobs, self.device)[:, :, None]  # 2 x [P, 1]
        index = to_device(torch.tensor([which, count_rows], dtype=torch.int64), self.device)
        b, c = index[0], index[1]
        seen = self.counts[c]  # [P, V]
        sub = torch.where(seen > 0, seen * freq + pres, 0.0)
        if len(which) == len(rows):  # every row penalized (a preset's penalty): no scatter
            return logits - sub, (b, c)
        out = logits.clone()
        out[b] = logits[b] - sub
        return out, (b, c)

    def add(self, counted: Counted | None, tokens: torch.Tensor) -> None:
        """Count each penalized row's sampled token (tokens [B] int64 on the device)."""
        if counted is None:
            return
        assert self.counts is not None
        b, c = counted
        self.counts.index_put_((c, tokens[b]), torch.ones_like(c, dtype=torch.float32), accumulate=True)

    def _claim(self, row: PenalizedRow) -> int:
        """The lane's count row, rewritten from the sampler's committed counts when another
        request (or none) owned it."""
        i = self._row_of.get(row.slot)
        if i is None:
            if len(self._row_of) == self.rows:
                raise RuntimeError(f"more than {self.rows} lanes decoded with penalties")
            i = self._row_of[row.slot] = len(self._row_of)
        sampler = row.sampler
        if self._owner[i] is not sampler:
            assert self.counts is not None
            self._owner[i] = sampler
            self.counts[i].zero_()
            if sampler.counts:
                ids = to_device(torch.tensor(list(sampler.counts), dtype=torch.int64), self.device)
                vals = torch.tensor(list(sampler.counts.values()), dtype=torch.float32)
                self.counts[i, ids] = to_device(vals, self.device)
        return i
