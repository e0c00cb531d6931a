"""The shared KV page pool's allocator: fixed 64-token pages, one pool sized at startup."""

from __future__ import annotations

from ninfer.model.config import PAGE_SIZE

PAGE = PAGE_SIZE  # tokens per KV page


def pages_for(tokens: int) -> int:
    """Pages needed to hold `tokens` KV entries."""
    return -(-tokens // PAGE)


class PageAllocator:
    """Hands out page indices of a pool fixed at startup; no growth, no over-commit."""

    def __init__(self, num_pages: int) -> None:
        if num_pages <= 0:
            raise ValueError(f"a page pool needs at least one page, got {num_pages}")
        self.num_pages = num_pages
        # LIFO free list: recently freed pages are reused first (warm in cache on CPU).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._used = bytearray(num_pages)

    @property
    def free_count(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        """Take `n` pages; raises `MemoryError` when fewer are free (callers check first)."""
        if n < 0:
            raise ValueError(f"negative page count {n}")
        if n > len(self._free):
            raise MemoryError(f"page pool exhausted: want {n}, free {len(self._free)}")
        out = [self._free.pop() for _ in range(n)]
        for p in out:
            self._used[p] = 1
        return out

    def free(self, pages: list[int]) -> None:
        """Return pages to the pool; a double free is a bookkeeping bug and raises."""
        for p in pages:
            if not self._used[p]:
                raise RuntimeError(f"page {p} freed twice")
            self._used[p] = 0
            self._free.append(p)
