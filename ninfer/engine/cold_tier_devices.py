"""Cold-tier arenas on secondary devices, filled and drained through a host staging buffer.

An entry is one uint8 buffer on the arena's device. Every transfer goes through the host staging
buffer in chunks of at most its size (primary -> staging -> arena on park, the reverse on
restore), so no peer access between devices is needed. `cuda_arenas` picks the secondary CUDA
devices the settings ask for (pinned staging); `CpuArenaStore` runs the same code over host
tensors, devices simulated (tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ninfer.engine.cold_tier_store import MIB, Arena, ColdTierStore

MIN_FREE = 512 * MIB  # device=-1: a secondary device needs this much free to host an arena
RESERVE = 256 * MIB  # capacity 0: each arena takes the device's free memory minus this


class Staging:
    """The host buffer every device-arena transfer goes through, chunk by chunk."""

    def __init__(self, nbytes: int, pinned: bool) -> None:
        if nbytes <= 0:
            raise ValueError("the staging buffer must be non-empty")
        self.buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)  # [nbytes] host

    @property
    def nbytes(self) -> int:
        return self.buf.numel()

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Chunked copy of flat uint8 `src` into `dst` (equal lengths) via the buffer; synchronous."""
        step = self.buf.numel()
        for i in range(0, src.numel(), step):
            m = min(step, src.numel() - i)
            self.buf[:m].copy_(src[i : i + m])
            dst[i : i + m].copy_(self.buf[:m])


class DeviceArena(Arena):
    """A device's share of the tier: one buffer per entry, reached through the staging buffer."""

    def __init__(self, device: torch.device, capacity: int, staging: Staging) -> None:
        super().__init__(device, capacity)
        self.staging = staging

    @property
    def staging_bytes(self) -> int:
        return self.staging.nbytes

    def allocate(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)  # [nbytes]

    def write(self, block: Any, offset: int, src: torch.Tensor) -> None:
        self.staging.copy(block[offset : offset + src.numel()], src)

    def read(self, block: Any, offset: int, dst: torch.Tensor) -> None:
        self.staging.copy(dst, block[offset : offset + dst.numel()])


class CpuArenaStore(ColdTierStore):
    """Host-memory arenas standing in for secondary devices (tests): same code path, CPU tensors."""

    def __init__(self, capacities: Sequence[int], staging_bytes: int = 64 * MIB) -> None:
        staging = Staging(staging_bytes, pinned=False)
        super().__init__([DeviceArena(torch.device("cpu"), int(c), staging) for c in capacities])


@dataclass(frozen=True)
class Place:
    """Where a device arena goes and how large it is."""

    device: torch.device
    capacity: int


def cuda_arenas(primary: torch.device, device: int, capacity_mib: int) -> tuple[list[Place], str]:
    """The secondary-device arenas the settings ask for, and why there are none when the list is empty."""
    count = torch.cuda.device_count()
    if count < 2:
        return [], f"{count} CUDA device(s) visible, no secondary one"
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
    places, skipped = [], []
    for i in candidates:
        free, _total = torch.cuda.mem_get_info(i)
        if device < 0 and free < MIN_FREE:
            skipped.append(f"cuda:{i} has {free / MIB:.0f} MiB free")
            continue
        cap = capacity_mib * MIB if capacity_mib > 0 else free - RESERVE
        if cap <= 0:
            skipped.append(f"cuda:{i} leaves no capacity")
            continue
        places.append(Place(torch.device("cuda", i), cap))
    return places, "; ".join(skipped) or "no secondary device"


def device_arenas(places: Sequence[Place], staging_bytes: int) -> list[Arena]:
    """One arena per place, sharing one pinned staging buffer."""
    if not places:
        return []
    staging = Staging(staging_bytes, pinned=True)
    return [DeviceArena(p.device, p.capacity, staging) for p in places]
