"""Giving freed heap pages back to the system after a large media decode.

A decode frees hundreds of MiB in PIL's and numpy's blocks of a few MiB each; glibc keeps such
blocks in its arenas (its mmap threshold grows after the first large free), so the process would
keep the peak of its largest decode for good. `malloc_trim(0)` returns those free pages; where the
C library has no such call it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable

# Decodes holding more than this trim the heap when they end.
TRIM_ABOVE_BYTES = 32 << 20

_lock = threading.Lock()
_trim: Callable[[int], int] | None = None
_loaded = False


def _malloc_trim() -> Callable[[int], int] | None:
    global _trim, _loaded
    with _lock:
        if not _loaded:
            _loaded = True
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _trim = libc.malloc_trim
            except (OSError, AttributeError):
                _trim = None
        return _trim


def return_free_heap() -> bool:
    """Ask the C allocator to return free pages to the system; False where that is not possible."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
