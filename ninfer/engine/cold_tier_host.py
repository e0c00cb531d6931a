"""The cold tier's host-RAM arena: parked images in pinned host memory (plain memory without CUDA).

The arena is one byte space of `capacity` bytes, backed by blocks of at most `BLOCK` bytes that are
allocated on first use and kept (pinned memory is slow to allocate: a block is pinned once and
reused by every later image). An entry holds a list of extents of that space, taken first fit from
the lowest addresses, so images never fail to fit for fragmentation and the blocks in use stay at
the low end. Copies between a pinned block and a CUDA tensor are asynchronous (they run on the
tier's transfer stream, `cold_tier_stream`); on the CPU they are plain copies.

`host_capacity` sizes the arena from the settings: `cold_tier.host_mib` N > 0 is N MiB (beside any
secondary-GPU arenas), 0 is no host arena, unset is `HOST_FRACTION` of the free host memory, used
only when no secondary GPU holds the tier.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import torch

from ninfer.engine.cold_tier_store import MIB, Arena
from ninfer.engine.config import COLD_TIER_HOST_SHARE as HOST_FRACTION

log = logging.getLogger("ninfer.engine.cold_tier")
BLOCK = 64 * MIB  # a power of two: the CUDA host allocator rounds pinned allocations up to one
GIB = 1 << 30

Extents = list[tuple[int, int]]  # (start, length) in the arena's byte space


class HostArena(Arena):
    """Host RAM, pinned when CUDA is available: block-backed byte space, entries as extents."""

    def __init__(self, capacity: int, pinned: bool, block_bytes: int = BLOCK) -> None:
        if capacity <= 0:
            raise ValueError("a host arena needs a positive capacity")
        super().__init__(torch.device("cpu"), capacity)
        self.pinned = pinned  # blocks are allocated pinned (until pinning fails once)
        self.block_bytes = min(block_bytes, capacity)
        count = -(-capacity // self.block_bytes)
        self._blocks: list[torch.Tensor | None] = [None] * count  # each [<= block_bytes] uint8
        self._free: Extents = [(0, capacity)]  # sorted by start, coalesced

    @property
    def allocated_bytes(self) -> int:
        """Host memory the arena holds now (its blocks)."""
        return sum(b.numel() for b in self._blocks if b is not None)

    # ----- extents -----
    def allocate(self, nbytes: int) -> Extents:
        taken: Extents = []
        need = nbytes
        while need > 0:
            if not self._free:
                self.release(taken)
                raise MemoryError(f"{nbytes} bytes do not fit in the host arena's free space")
            start, length = self._free[0]
            n = min(need, length)
            taken.append((start, n))
            self._free[0:1] = [(start + n, length - n)] if n < length else []
            need -= n
        bb = self.block_bytes
        try:
            for start, n in taken:  # the blocks under the extents exist before any copy
                for blk in range(start // bb, (start + n - 1) // bb + 1):
                    self._block(blk)
        except Exception:
            self.release(taken)
            raise
        return taken

    def release(self, block: Any) -> None:
        merged: Extents = []
        for start, n in sorted([*self._free, *block]):
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            elif n:
                merged.append((start, n))
        self._free = merged

    def _block(self, i: int) -> torch.Tensor:
        """Block i, allocated on first use."""
        b = self._blocks[i]
        if b is None:
            size = min(self.block_bytes, self.capacity - i * self.block_bytes)
            b = None
            if self.pinned:
                try:
                    b = torch.empty(size, dtype=torch.uint8, pin_memory=True)
                except RuntimeError as exc:
                    self.pinned = False
                    log.warning("cold tier: pinning host memory failed, later blocks are plain: %s", exc)
            if b is None:
                b = torch.empty(size, dtype=torch.uint8)
            self._blocks[i] = b
        return b

    def _segments(self, extents: Extents, offset: int, n: int) -> Iterator[tuple[int, int, int, int]]:
        """(block, offset in the block, length, offset in the request) covering the entry bytes
        [offset, offset + n) of an entry stored in `extents`."""
        pos = 0  # entry byte at the start of the current extent
        for start, length in extents:
            lo, hi = max(offset, pos), min(offset + n, pos + length)
            a = start + lo - pos  # arena byte of entry byte lo
            while lo < hi:
                blk = a // self.block_bytes
                m = min(hi - lo, (blk + 1) * self.block_bytes - a)
                yield blk, a - blk * self.block_bytes, m, lo - offset
                a, lo = a + m, lo + m
            pos += length
            if pos >= offset + n:
                return

    # ----- transfers -----
    def write(self, block: Any, offset: int, src: torch.Tensor) -> None:
        for blk, at, m, i in self._segments(block, offset, src.numel()):
            b = self._block(blk)
            b[at : at + m].copy_(src[i : i + m], non_blocking=b.is_pinned())

    def read(self, block: Any, offset: int, dst: torch.Tensor) -> None:
        for blk, at, m, i in self._segments(block, offset, dst.numel()):
            b = self._block(blk)
            dst[i : i + m].copy_(b[at : at + m], non_blocking=b.is_pinned())


def free_host_bytes() -> int:
    """The host memory available to new allocations (MemAvailable; free pages without /proc)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def host_capacity(host_mib: int | None, beside_devices: bool) -> tuple[int, str]:
    """The host arena's bytes (0: none) and how they were chosen (or why there are none)."""
    if host_mib == 0:
        return 0, "the host arena is off (cold_tier.host_mib=0)"
    if host_mib is not None:
        return host_mib * MIB, f"cold_tier.host_mib={host_mib}"
    if beside_devices:
        return 0, "secondary GPUs hold the tier (cold_tier.host_mib adds a host arena beside them)"
    free = free_host_bytes()
    if free <= 0:
        return 0, "the free host memory is unknown: set cold_tier.host_mib"
    return int(free * HOST_FRACTION), f"{HOST_FRACTION:.0%} of {free / GIB:.1f} GiB free host memory"


def host_arena(host_mib: int | None, beside_devices: bool) -> tuple[HostArena | None, str]:
    """The host arena the settings ask for (pinned when CUDA is available), with its sizing line."""
    capacity, how = host_capacity(host_mib, beside_devices)
    if capacity <= 0:
        return None, how
    pinned = torch.cuda.is_available()
    arena = HostArena(capacity, pinned)
    kind = "pinned" if pinned else "plain (no CUDA: not pinned)"
    return arena, f"host arena {capacity / GIB:.2f} GiB, {kind}, {how}"
