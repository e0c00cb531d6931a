"""Cold-tier arenas: LRU byte stores on secondary devices, filled and drained through a staging buffer.

An entry is a list of tensors (the pieces of one serialized lane image) written back to back into
one uint8 buffer on an arena's device, plus opaque host metadata. Every transfer goes through the
host staging buffer in chunks of at most its size (primary -> staging -> arena on park, the reverse
on restore), so no peer access between devices is needed. Arenas account bytes against their
capacity and evict their least recently used entries to make room.

`CudaArenaStore` puts one arena on each secondary CUDA device with pinned staging; `CpuArenaStore`
runs the same code over host tensors with simulated devices (tests).
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

MIB = 1 << 20
MIN_FREE = 512 * MIB  # device=-1: a secondary device needs this much free to host an arena
RESERVE = 256 * MIB  # capacity 0: each arena takes the device's free memory minus this


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


@dataclass
class Entry:
    key: int
    arena: Arena
    data: torch.Tensor  # [nbytes] uint8 on the arena's device
    specs: tuple[PieceSpec, ...]
    meta: Any

    @property
    def nbytes(self) -> int:
        return self.data.numel()


@dataclass
class Arena:
    """One device's share of the tier: entries in LRU order (oldest first), bytes against capacity."""

    device: torch.device
    capacity: int
    entries: OrderedDict[int, Entry] = field(default_factory=OrderedDict)
    used: int = 0

    def describe(self) -> dict[str, Any]:
        return {
            "device": str(self.device),
            "capacity_bytes": self.capacity,
            "used_bytes": self.used,
            "entries": len(self.entries),
        }


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as a flat uint8 view. -> [nbytes]"""
    t = t.contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    return t.view(torch.uint8).reshape(-1)


class ColdTierStore(ABC):
    """Arenas plus the staging buffer; the policy (`ninfer.engine.cold_tier`) decides what goes in."""

    def __init__(self, arenas: Sequence[Arena], staging: torch.Tensor) -> None:
        if not arenas:
            raise ValueError("a cold-tier store needs at least one arena")
        if staging.dtype != torch.uint8 or staging.dim() != 1 or staging.numel() == 0:
            raise ValueError("the staging buffer must be a non-empty flat uint8 tensor")
        self.arenas = list(arenas)
        self.staging = staging  # [staging_bytes] uint8, host
        self.evictions = 0
        self._keys = itertools.count(1)
        self._where: dict[int, Arena] = {}
        self._clock = itertools.count(1)
        self._touched: dict[int, int] = {}  # key -> last use, global LRU across arenas
        self._pinned: set[int] = set()  # entries about to be restored: never evicted

    # ----- what the device implementation provides -----
    @abstractmethod
    def _allocate(self, arena: Arena, nbytes: int) -> torch.Tensor:
        """A [nbytes] uint8 buffer on the arena's device (raises on failure)."""

    def _copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst <- src, both flat uint8 of equal length; synchronous."""
        dst.copy_(src)

    # ----- occupancy -----
    @property
    def capacity_bytes(self) -> int:
        return sum(a.capacity for a in self.arenas)

    @property
    def used_bytes(self) -> int:
        return sum(a.used for a in self.arenas)

    @property
    def staging_bytes(self) -> int:
        return self.staging.numel()

    def __len__(self) -> int:
        return len(self._where)

    def entries(self) -> Iterator[tuple[int, Any]]:
        """(key, meta) of every entry, most recently used first."""
        for key in sorted(self._where, key=lambda k: -self._touched[k]):
            yield key, self._where[key].entries[key].meta

    # ----- transfers -----
    def _through_staging(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Chunked copy of flat uint8 `src` into `dst` via the staging buffer."""
        step = self.staging.numel()
        for i in range(0, src.numel(), step):
            m = min(step, src.numel() - i)
            self._copy(self.staging[:m], src[i : i + m])
            self._copy(dst[i : i + m], self.staging[:m])

    def pin(self, key: int) -> None:
        """Keep an entry from LRU eviction until `unpin` (or `take`)."""
        self._pinned.add(key)

    def unpin(self, key: int) -> None:
        self._pinned.discard(key)

    def _drop(self, key: int) -> None:
        arena = self._where.pop(key)
        entry = arena.entries.pop(key)
        arena.used -= entry.nbytes
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

    def put(self, specs: Sequence[PieceSpec], pieces: Iterable[torch.Tensor], meta: Any) -> int:
        """Store the pieces `specs` announce (produced one at a time, on any device: the caller's
        temporaries stay one piece large) under a new key, evicting LRU entries for room."""
        specs = tuple(specs)
        nbytes = sum(s.nbytes for s in specs)
        arena = self._pick_arena(nbytes)
        while arena.capacity - arena.used < nbytes:
            if not self._evict_one(arena):
                raise ParkError(f"no room for {nbytes} bytes on {arena.device}: the rest is being restored")
        data = None
        while data is None:
            try:
                data = self._allocate(arena, nbytes)
            except Exception as exc:  # e.g. a fragmented device: make room, then give up
                if not self._evict_one(arena):
                    raise ParkError(f"cannot allocate {nbytes} bytes on {arena.device}: {exc}") from exc
        try:
            off, it = 0, iter(pieces)
            for spec in specs:
                p = next(it)
                if PieceSpec(tuple(p.shape), p.dtype) != spec:
                    raise ParkError(f"piece {tuple(p.shape)} {p.dtype} does not match {spec}")
                if spec.nbytes:
                    self._through_staging(data[off : off + spec.nbytes], _flat_bytes(p))
                off += spec.nbytes
            if next(it, None) is not None:
                raise ParkError("more pieces than announced")
        except Exception as exc:
            raise ParkError(f"transfer to {arena.device} failed: {type(exc).__name__}: {exc}") from exc
        key = next(self._keys)
        arena.entries[key] = Entry(key, arena, data, specs, meta)
        arena.used += nbytes
        self._where[key] = arena
        self._touched[key] = next(self._clock)
        return key

    def take(self, key: int, device: torch.device) -> tuple[Any, Iterator[torch.Tensor]]:
        """Remove an entry and return its metadata and its pieces, read back one at a time as new
        tensors on `device` (a failed transfer raises `RestoreError` from the iterator)."""
        if key not in self._where:
            raise RestoreError(f"no cold-tier entry {key}")
        entry = self._where[key].entries[key]
        self._drop(key)
        return entry.meta, self._read(entry, device)

    def _read(self, entry: Entry, device: torch.device) -> Iterator[torch.Tensor]:
        off = 0
        for spec in entry.specs:
            try:
                t = torch.empty(spec.shape, dtype=spec.dtype, device=device)
                if spec.nbytes:  # a fresh tensor is contiguous: the flat view shares its storage
                    self._through_staging(_flat_bytes(t), entry.data[off : off + spec.nbytes])
            except Exception as exc:
                raise RestoreError(
                    f"transfer from {entry.arena.device} failed: {type(exc).__name__}: {exc}"
                ) from exc
            off += spec.nbytes
            yield t


class CpuArenaStore(ColdTierStore):
    """Host-memory arenas standing in for secondary devices (tests): same code path, CPU tensors."""

    def __init__(self, capacities: Sequence[int], staging_bytes: int = 64 * MIB) -> None:
        arenas = [Arena(torch.device("cpu"), int(c)) for c in capacities]
        super().__init__(arenas, torch.empty(staging_bytes, dtype=torch.uint8))

    def _allocate(self, arena: Arena, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)


class CudaArenaStore(ColdTierStore):
    """One arena per secondary CUDA device; pinned host staging."""

    def __init__(self, arenas: Sequence[Arena], staging_bytes: int) -> None:
        staging = torch.empty(staging_bytes, dtype=torch.uint8, pin_memory=True)
        super().__init__(arenas, staging)

    def _allocate(self, arena: Arena, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=arena.device)


def cuda_arenas(primary: torch.device, device: int, capacity_mib: int) -> tuple[list[Arena], str]:
    """The arenas the settings ask for, and why there are none when the list is empty."""
    count = torch.cuda.device_count()
    if count < 2:
        return [], f"{count} CUDA device(s) visible, the tier needs a secondary one"
    main = primary.index if primary.index is not None else torch.cuda.current_device()
    if device >= 0:
        if device >= count or device == main:
            return (
                [],
                f"cold_tier.device={device} is not a secondary device (devices 0..{count - 1}, primary {main})",
            )
        candidates = [device]
    else:
        candidates = [i for i in range(count) if i != main]
    arenas, skipped = [], []
    for i in candidates:
        free, _total = torch.cuda.mem_get_info(i)
        if device < 0 and free < MIN_FREE:
            skipped.append(f"cuda:{i} has {free / MIB:.0f} MiB free")
            continue
        cap = capacity_mib * MIB if capacity_mib > 0 else free - RESERVE
        if cap <= 0:
            skipped.append(f"cuda:{i} leaves no capacity")
            continue
        arenas.append(Arena(torch.device("cuda", i), cap))
    return arenas, "; ".join(skipped) or "no secondary device"
