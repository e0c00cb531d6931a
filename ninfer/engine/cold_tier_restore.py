"""Restoring a parked image a chunk per engine round, paced to one decode step of the other rows.

A `RestoreJob` walks an opened entry's pieces in order and moves a bounded number of bytes per
call: whole first-dimension rows of a piece (KV pages, GDN slots) read into a temporary on the
engine device and scattered into the pools, on the tier's transfer stream. Pieces without a
scatter target (the MTP drafter's pending rows) are read whole into tensors of their own and
handed back when the job ends. The job is done once every chunk is enqueued and the transfer
stream has run them (`Marker.done`); the caller then joins the streams and installs the lane.

`Pacer` decides how many bytes a round moves: while other requests decode, the bytes the restore
copies in one decode step (the copy rate and the step time, both measured as they run); with
nothing else to run, `most` bytes a round; a fixed amount when configured (tests, tuning).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ninfer.engine.cold_tier_store import ColdTierStore, Entry, PieceSpec, flat_bytes
from ninfer.engine.cold_tier_stream import Marker, TransferStream

Scatter = Callable[[int, int, torch.Tensor], None]  # rows [r0, r1) of a piece, read -> the pools
EMA = 0.3  # weight of the newest measurement
LEAST = 256 << 10  # a paced round moves at least this much (one row when rows are larger)


@dataclass
class Pacer:
    """Bytes per round for the restores: one decode step's worth of copying while others decode."""

    most: int  # with nothing else to run (and the most a paced round moves)
    fixed: int = 0  # > 0: always this many (tests, tuning)
    step_s: float | None = None  # an engine round with other rows, less the restore's own share
    rate: float | None = None  # bytes per second the restore copies

    def budget(self, busy: bool) -> int:
        if self.fixed > 0:
            return self.fixed
        if not busy:
            return self.most
        if self.step_s is None or self.rate is None:
            return LEAST
        return int(min(self.most, max(LEAST, self.rate * self.step_s)))

    def observe_step(self, seconds: float) -> None:
        if seconds > 0:
            self.step_s = seconds if self.step_s is None else (1 - EMA) * self.step_s + EMA * seconds

    def observe_copy(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            r = nbytes / seconds
            self.rate = r if self.rate is None else (1 - EMA) * self.rate + EMA * r


@dataclass(frozen=True)
class Target:
    """Where one piece of an image goes: rows scattered into the pools, or kept whole (None)."""

    spec: PieceSpec
    scatter: Scatter | None


@dataclass
class RestoreJob:
    """One parked image on its way into a lane (engine thread only)."""

    key: int
    entry: Entry
    targets: Sequence[Target]
    seq_id: int
    device: torch.device
    piece: int = 0  # the next piece to move
    row: int = 0  # the next row of that piece
    kept: list[torch.Tensor] = field(default_factory=list)  # pieces without a scatter, in order
    chunks: int = 0  # rounds that moved bytes
    moved: int = 0
    last: int = 0  # bytes of the last chunk
    start: Marker | None = None  # around the last chunk enqueued
    end: Marker | None = None

    def __post_init__(self) -> None:
        if [t.spec for t in self.targets] != list(self.entry.specs):
            raise ValueError("the image's pieces do not match the pools")
        self._offsets = self.entry.offsets()

    @property
    def enqueued(self) -> bool:
        """Every chunk is on its way."""
        return self.piece >= len(self.targets)

    def step(self, store: ColdTierStore, stream: TransferStream, budget: int) -> int:
        """Enqueue up to `budget` bytes (at least one row) on `stream`; -> bytes enqueued."""
        moved = 0
        self.start = stream.mark()
        while not self.enqueued and (moved == 0 or moved < budget):
            t = self.targets[self.piece]
            spec, rows = t.spec, t.spec.shape[0] if t.spec.shape else 1
            if t.scatter is None:  # kept whole
                moved += self._keep(store, stream, spec)
                self.piece += 1
                continue
            per_row, left = spec.row_bytes, rows - self.row
            if left <= 0 or per_row == 0:  # an empty piece
                self.piece, self.row = self.piece + 1, 0
                continue
            take = max(1, min(left, (budget - moved) // per_row))
            r0, r1 = self.row, self.row + take
            with stream.scope():
                part = torch.empty((take, *spec.shape[1:]), dtype=spec.dtype, device=self.device)
                store.read(self.entry, self._offsets[self.piece] + r0 * per_row, flat_bytes(part))
                t.scatter(r0, r1, part)
            moved += take * per_row
            self.row = r1
            if r1 >= rows:
                self.piece, self.row = self.piece + 1, 0
        self.end = stream.mark()
        self.chunks += 1
        self.moved += moved
        self.last = moved
        return moved

    def _keep(self, store: ColdTierStore, stream: TransferStream, spec: PieceSpec) -> int:
        out = torch.empty(spec.shape, dtype=spec.dtype, device=self.device)  # the engine's stream
        if spec.nbytes:
            with stream.scope():
                store.read(self.entry, self._offsets[self.piece], flat_bytes(out))
            stream.guard(out)
        self.kept.append(out)
        return spec.nbytes
