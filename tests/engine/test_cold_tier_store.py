"""The arena store on host tensors: chunked round trips keep every byte and dtype, LRU by bytes
across arenas, pinned entries survive eviction, oversize images are refused; the host arena's
extents span blocks and reuse freed space."""

from __future__ import annotations

import pytest
import torch

from ninfer.engine.cold_tier_devices import CpuArenaStore
from ninfer.engine.cold_tier_host import HostArena
from ninfer.engine.cold_tier_store import ColdTierStore, ParkError, PieceSpec, RestoreError


def _pieces(seed: int, n: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(n, 64, 2, 16, generator=g).to(torch.bfloat16),
        torch.randint(-127, 128, (n, 64, 2, 16), generator=g, dtype=torch.int8),
        torch.rand(n, 64, 2, generator=g),
        torch.randn(2, 4, 8, 8, generator=g, dtype=torch.float64),
        torch.empty(0, 32),
    ]


def _put(store: ColdTierStore, pieces: list[torch.Tensor], meta: object) -> int:
    return store.put([PieceSpec(tuple(p.shape), p.dtype) for p in pieces], iter(pieces), meta)


def _take(store: ColdTierStore, key: int) -> tuple[object, list[torch.Tensor]]:
    """Read an entry back piece by piece, then drop it."""
    entry = store.open(key)
    back = []
    for spec, off in zip(entry.specs, entry.offsets(), strict=True):
        t = torch.empty(spec.shape, dtype=spec.dtype)
        store.read(entry, off, t.view(torch.uint8).reshape(-1))
        back.append(t)
    store.close(key, keep=False)
    return entry.meta, back


def _nbytes(pieces: list[torch.Tensor]) -> int:
    return sum(p.numel() * p.element_size() for p in pieces)


def test_round_trip_through_a_small_staging_buffer() -> None:
    store = CpuArenaStore([1 << 20], staging_bytes=100)  # many chunks per piece, a partial last one
    src = _pieces(0)
    key = _put(store, src, {"m": 1})
    assert store.used_bytes == _nbytes(src) and len(store) == 1
    meta, back = _take(store, key)
    assert meta == {"m": 1} and len(store) == 0 and store.used_bytes == 0
    for a, b in zip(src, back, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    with pytest.raises(RestoreError):
        store.open(key)


def test_lru_by_bytes_across_arenas_and_pins() -> None:
    size = _nbytes(_pieces(0))
    store = CpuArenaStore([2 * size, 1 * size], staging_bytes=4096)
    keys = [_put(store, _pieces(i), i) for i in range(3)]  # fills both arenas
    assert store.evictions == 0 and store.used_bytes == 3 * size
    assert [m for _, m in store.entries()] == [2, 1, 0]  # most recent first
    store.pin(keys[0])
    k3 = _put(store, _pieces(3), 3)  # the oldest overall is pinned: the next oldest (1) goes
    assert store.evictions == 1 and sorted(m for _, m in store.entries()) == [0, 2, 3]
    store.unpin(keys[0])
    _put(store, _pieces(4), 4)
    assert store.evictions == 2 and sorted(m for _, m in store.entries()) == [2, 3, 4]
    _, back = _take(store, k3)
    assert all(torch.equal(a, b) for a, b in zip(_pieces(3), back, strict=True))
    with pytest.raises(ParkError):
        _put(store, _pieces(5, n=9), 5)  # larger than every arena
    bad = _pieces(6)
    with pytest.raises(ParkError):
        store.put([PieceSpec((1,), torch.float32)] * len(bad), iter(bad), 6)
    assert store.used_bytes == sum(a.used for a in store.arenas) == 2 * size


def test_host_arena_extents_span_blocks_and_reuse_freed_space() -> None:
    """Blocks of 1000 bytes: every image crosses blocks; after the LRU drop, the next image fills
    the hole it left and the space after the last one, with every byte intact."""
    size, big = _nbytes(_pieces(0)), _pieces(9, n=4)
    arena = HostArena(3 * size + (_nbytes(big) - size) + 100, pinned=False, block_bytes=1000)
    store = ColdTierStore([arena])
    keys = [_put(store, _pieces(i), i) for i in range(3)]
    assert arena.allocated_bytes == -(-3 * size // 1000) * 1000  # only the blocks used so far
    # larger than the image it evicts: the hole it leaves, then the space after the others
    k = _put(store, big, 9)
    assert store.evictions == 1 and sorted(m for _, m in store.entries()) == [1, 2, 9]
    assert len(arena.entries[k].block) == 2 and store.used_bytes == 2 * size + _nbytes(big)
    for key, want in ((k, big), (keys[2], _pieces(2)), (keys[1], _pieces(1))):
        _, back = _take(store, key)
        assert all(torch.equal(a, b) for a, b in zip(want, back, strict=True))
    assert store.used_bytes == 0 and arena._free == [(0, arena.capacity)]
