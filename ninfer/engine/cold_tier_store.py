"""The cold tier's entry store: lane images in LRU byte arenas, across every arena of the tier.

An entry is the pieces of one serialized lane image (a list of tensors, `PieceSpec`s) written back
to back into one arena's storage, plus opaque host metadata. Arenas account bytes against their
capacity; the store evicts the least recently used entries (across arenas) to make room, never an
entry that is pinned (an image being restored). What an arena's storage is and how bytes reach it
is the arena's own (`Arena`): a secondary GPU through host staging (`cold_tier_devices`), or host
RAM (`cold_tier_host`). The policy (`ninfer.engine.cold_tier`) decides what goes in.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ninfer.engine.cold_tier_stream import TransferStream

MIB = 1 << 20


class ParkError(RuntimeError):
    """An image could not be stored (oversize, allocation or transfer failure)."""


class RestoreError(RuntimeError):
    """A stored image could not be read back."""


@dataclass(frozen=True)
class PieceSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        """Bytes of one index along the first dimension."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as a flat uint8 view. -> [nbytes]"""
    t = t.contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    return t.view(torch.uint8).reshape(-1)


@dataclass
class Entry:
    key: int
    arena: Arena
    block: Any  # the arena's handle on the entry's bytes
    specs: tuple[PieceSpec, ...]
    meta: Any

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    def offsets(self) -> list[int]:
        """The byte offset of each piece in the entry."""
        return list(itertools.accumulate((s.nbytes for s in self.specs), initial=0))[:-1]


@dataclass(eq=False)
class Arena(ABC):
    """One place the tier keeps images: entries in LRU order (oldest first), bytes against capacity."""

    device: torch.device
    capacity: int
    entries: OrderedDict[int, Entry] = field(default_factory=OrderedDict)
    used: int = 0

    @property
    def staging_bytes(self) -> int:
        """The host staging buffer its transfers go through (0: none)."""
        return 0

    def describe(self) -> dict[str, Any]:
        return {
            "device": str(self.device),
            "capacity_bytes": self.capacity,
            "used_bytes": self.used,
            "entries": len(self.entries),
        }

    @abstractmethod
    def allocate(self, nbytes: int) -> Any:
        """Storage for `nbytes` bytes (raises on failure)."""

    def release(self, block: Any) -> None:  # noqa: B027 - storage that is simply dropped
        """Storage from `allocate` is no longer used."""

    @abstractmethod
    def write(self, block: Any, offset: int, src: torch.Tensor) -> None:
        """block[offset : offset + len(src)] <- src, a flat uint8 tensor on any device."""

    @abstractmethod
    def read(self, block: Any, offset: int, dst: torch.Tensor) -> None:
        """dst <- block[offset : offset + len(dst)], into a flat uint8 tensor on any device."""


class ColdTierStore:
    """Entries across arenas with a global LRU order, pins, and eviction for room."""

    def __init__(self, arenas: Sequence[Arena]) -> None:
        if not arenas:
            raise ValueError("a cold-tier store needs at least one arena")
        self.arenas = list(arenas)
        self.evictions = 0
        self._keys = itertools.count(1)
        self._where: dict[int, Arena] = {}
        self._clock = itertools.count(1)
        self._touched: dict[int, int] = {}  # key -> last use, global LRU across arenas
        self._pinned: set[int] = set()  # entries being restored: never evicted

    # ----- occupancy -----
    @property
    def capacity_bytes(self) -> int:
        return sum(a.capacity for a in self.arenas)

    @property
    def used_bytes(self) -> int:
        return sum(a.used for a in self.arenas)

    @property
    def staging_bytes(self) -> int:
        return max(a.staging_bytes for a in self.arenas)

    def __len__(self) -> int:
        return len(self._where)

    def entries(self) -> Iterator[tuple[int, Any]]:
        """(key, meta) of every entry, most recently used first."""
        for key in sorted(self._where, key=lambda k: -self._touched[k]):
            yield key, self._where[key].entries[key].meta

    # ----- pins and eviction -----
    def pin(self, key: int) -> None:
        """Keep an entry from LRU eviction until `unpin` (or `close`)."""
        self._pinned.add(key)

    def unpin(self, key: int) -> None:
        self._pinned.discard(key)

    def _drop(self, key: int) -> None:
        arena = self._where.pop(key)
        entry = arena.entries.pop(key)
        arena.used -= entry.nbytes
        arena.release(entry.block)
        self._touched.pop(key, None)
        self._pinned.discard(key)

    def _evict_one(self, arena: Arena) -> bool:
        """Drop the arena's least recently used unpinned entry; False when there is none."""
        key = next((k for k in arena.entries if k not in self._pinned), None)
        if key is None:
            return False
        self._drop(key)
        self.evictions += 1
        return True

    def _pick_arena(self, nbytes: int) -> Arena:
        fits = [a for a in self.arenas if a.capacity >= nbytes]
        if not fits:
            raise ParkError(f"image of {nbytes} bytes is larger than every arena")
        room = [a for a in fits if a.capacity - a.used >= nbytes]
        if room:
            return max(room, key=lambda a: a.capacity - a.used)

        def oldest(a: Arena) -> int:  # the arena whose least recent entry is the oldest overall
            return min((self._touched[k] for k in a.entries if k not in self._pinned), default=0)

        return min(fits, key=oldest)

    # ----- park -----
    def put(
        self,
        specs: Sequence[PieceSpec],
        pieces: Iterable[torch.Tensor],
        meta: Any,
        stream: TransferStream | None = None,
    ) -> int:
        """Store the pieces `specs` announce under a new key, evicting LRU entries for room. The
        pieces are produced one at a time on the caller's stream (its temporaries stay one piece
        large) and copied on `stream` (None: synchronously, on the CPU)."""
        specs = tuple(specs)
        nbytes = sum(s.nbytes for s in specs)
        arena = self._pick_arena(nbytes)
        while arena.capacity - arena.used < nbytes:
            if not self._evict_one(arena):
                raise ParkError(f"no room for {nbytes} bytes on {arena.device}: the rest is being restored")
        block = None
        while block is None:
            try:
                block = arena.allocate(nbytes)
            except Exception as exc:  # e.g. a fragmented device: make room, then give up
                if not self._evict_one(arena):
                    raise ParkError(f"cannot allocate {nbytes} bytes on {arena.device}: {exc}") from exc
        try:
            self._write(arena, block, specs, pieces, stream or TransferStream(torch.device("cpu")))
        except Exception as exc:
            arena.release(block)
            raise ParkError(f"transfer to {arena.device} failed: {type(exc).__name__}: {exc}") from exc
        key = next(self._keys)
        arena.entries[key] = Entry(key, arena, block, specs, meta)
        arena.used += nbytes
        self._where[key] = arena
        self._touched[key] = next(self._clock)
        return key

    @staticmethod
    def _write(
        arena: Arena,
        block: Any,
        specs: tuple[PieceSpec, ...],
        pieces: Iterable[torch.Tensor],
        stream: TransferStream,
    ) -> None:
        off, it = 0, iter(pieces)
        for spec in specs:
            p = next(it)
            if PieceSpec(tuple(p.shape), p.dtype) != spec:
                raise ParkError(f"piece {tuple(p.shape)} {p.dtype} does not match {spec}")
            if spec.nbytes:
                src = flat_bytes(p)
                stream.follow()  # the piece was gathered on the engine's stream
                with stream.scope():
                    arena.write(block, off, src)
                stream.keep(src)
            off += spec.nbytes
        if next(it, None) is not None:
            raise ParkError("more pieces than announced")

    # ----- restore -----
    def open(self, key: int) -> Entry:
        """The entry under `key`, pinned until `close`."""
        arena = self._where.get(key)
        if arena is None:
            raise RestoreError(f"no cold-tier entry {key}")
        self.pin(key)
        return arena.entries[key]

    def read(self, entry: Entry, offset: int, dst: torch.Tensor) -> None:
        """dst <- the entry's bytes [offset, offset + len(dst)) (a flat uint8 tensor on any device)."""
        try:
            entry.arena.read(entry.block, offset, dst)
        except Exception as exc:
            raise RestoreError(
                f"transfer from {entry.arena.device} failed: {type(exc).__name__}: {exc}"
            ) from exc

    def close(self, key: int, keep: bool) -> None:
        """An opened entry is done with: kept parked (unpinned) or dropped (restored, or broken)."""
        if key not in self._where:
            return
        if keep:
            self.unpin(key)
        else:
            self._drop(key)
