"""Prepared-media cache: SHA-256 + modality keyed LRU, single-flight builds, refcounted live-byte budget.

* Every payload is *live* while anything references it (the LRU's retention is one reference,
  each `MediaRef` another); live bytes never exceed `live_bytes`. A payload's bytes are returned
  only when its last reference goes, so evicting it from the LRU never invalidates a request's ref.
* `retain_bytes` (``--media-cache-mib``) bounds what the LRU retains; 0 retains nothing.
* Concurrent misses of one key run one build; the others wait for it (single flight).
* Builds run on a bounded worker pool. The live-byte reservation is made on the requesting
  thread once the build is done, waiting (until the caller's deadline) for other references to
  be released; a payload larger than the whole live budget fails at once.
* `hold(n, deadline)` holds `n` live bytes for the duration of a build's decode: decoded pixels
  are accounted against the live limit before they exist (a decode larger than the whole limit
  fails at once, else it waits like a payload), and freed heap pages go back to the system
  after a large one (`ninfer.media.heap.return_free_heap`).
* `gate` is the preparation permit: one request prepares at a time, so two partially prepared
  requests can never each hold part of the live budget while waiting for the rest.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from ninfer.media.config import PreparedMedia
from ninfer.media.errors import BUDGET_EXCEEDED, MediaError
from ninfer.media.heap import TRIM_ABOVE_BYTES, return_free_heap

MediaKey = tuple[str, str]  # (sha256 hex of the acquired bytes, modality)


class PreparationTimeout(TimeoutError):
    """The caller's deadline passed while waiting for the preparation permit or live bytes."""


def worker_count(configured: int) -> int:
    """``--media-preprocess-threads``: 0 selects min(16, host concurrency)."""
    return configured if configured > 0 else min(16, os.cpu_count() or 1)


@dataclass
class MediaCounters:
    """Cache events; one instance per request (for the request log) and one process-wide."""

    hits: int = 0
    misses: int = 0
    single_flight_waits: int = 0
    built_bytes: int = 0
    reused_bytes: int = 0
    build_seconds: float = 0.0

    def add(self, other: MediaCounters) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(eq=False)
class _Entry:
    media: PreparedMedia
    refs: int = 0


class MediaRef:
    """One counted reference to a live payload; `release()` (idempotent) or use as a context manager."""

    def __init__(self, cache: MediaCache, entry: _Entry) -> None:
        self._cache = cache
        self._entry: _Entry | None = entry

    @property
    def media(self) -> PreparedMedia:
        if self._entry is None:
            raise RuntimeError("media reference already released")
        return self._entry.media

    def share(self) -> MediaRef:
        """Another reference to the same payload (e.g. for the engine while the request keeps its own)."""
        entry = self._entry
        if entry is None:
            raise RuntimeError("media reference already released")
        with self._cache._cond:
            entry.refs += 1
        return MediaRef(self._cache, entry)

    def release(self) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            self._cache._unref(entry)

    def __enter__(self) -> MediaRef:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(eq=False)
class _Flight:
    future: Future | None = None
    waiters: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    entry: _Entry | None = None
    error: BaseException | None = None


class Pending:
    """A requested payload: a hit, the build this caller owns, or a wait on another caller's build."""

    def __init__(
        self, cache: MediaCache, key: MediaKey, flight: _Flight | None, entry: _Entry | None, owner: bool
    ):
        self._cache, self._key, self._flight, self._entry, self._owner = cache, key, flight, entry, owner

    def result(self, deadline: float | None = None, counters: MediaCounters | None = None) -> MediaRef:
        """Wait for the payload and return a reference; MediaError / PreparationTimeout on failure."""
        if self._entry is not None:
            return MediaRef(self._cache, self._entry)
        flight = self._flight
        assert flight is not None
        if self._owner:
            return self._cache._finish(self._key, flight, deadline, counters)
        if not flight.done.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
            self._cache._abandon(flight)
            raise PreparationTimeout("media preparation deadline passed")
        if flight.error is not None:
            raise flight.error
        assert flight.entry is not None
        return MediaRef(self._cache, flight.entry)


class MediaCache:
    """The process-wide prepared-media store (see the module docstring)."""

    def __init__(self, retain_bytes: int, live_bytes: int, threads: int = 0) -> None:
        self.retain_limit = retain_bytes
        self.live_limit = live_bytes
        self._cond = threading.Condition()
        self._lru: OrderedDict[MediaKey, _Entry] = OrderedDict()
        self._flights: dict[MediaKey, _Flight] = {}
        self._retained = 0
        self._live = 0
        self._pool = ThreadPoolExecutor(worker_count(threads), thread_name_prefix="media-prep")
        self._gate = threading.Lock()
        self.counters = MediaCounters()

    # ---- accounting views ----
    @property
    def live_bytes(self) -> int:
        return self._live

    @property
    def retained_bytes(self) -> int:
        return self._retained

    def byte_counts(self) -> tuple[int, int]:
        """(live, retained) bytes read together, so live >= retained holds in every reading."""
        with self._cond:
            return self._live, self._retained

    def __contains__(self, key: MediaKey) -> bool:
        with self._cond:
            return key in self._lru

    @contextmanager
    def gate(self, deadline: float | None = None) -> Iterator[None]:
        """The preparation permit (one preparing request at a time), waited for until `deadline`."""
        timeout = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._gate.acquire(timeout=timeout):
            raise PreparationTimeout("waiting for the media preparation permit timed out")
        try:
            yield
        finally:
            self._gate.release()

    def check_fits(self, nbytes: int) -> None:
        """MediaError (budget) when a decode of `nbytes` could never fit the live limit."""
        if nbytes > self.live_limit:
            raise MediaError(
                BUDGET_EXCEEDED,
                f"decoding the media needs {nbytes >> 20} MiB, over the live media limit of "
                f"{self.live_limit >> 20} MiB",
            )

    @contextmanager
    def hold(self, nbytes: int, deadline: float | None = None) -> Iterator[None]:
        """`nbytes` of transient decode memory held against the live limit while the block runs."""
        self.check_fits(nbytes)
        with self._cond:
            self._wait_for_room(nbytes, deadline)
            self._live += nbytes
        try:
            yield
        finally:
            with self._cond:
                self._live -= nbytes
                self._cond.notify_all()
            if nbytes > TRIM_ABOVE_BYTES:
                return_free_heap()

    def start(
        self, key: MediaKey, build: Callable[[], PreparedMedia], counters: MediaCounters | None = None
    ) -> Pending:
        """Look `key` up; on a miss submit `build` to the pool (or join the build already running)."""
        local = MediaCounters()
        with self._cond:
            entry = self._lru.get(key)
            if entry is not None:
                self._lru.move_to_end(key)
                entry.refs += 1
                local.hits += 1
                local.reused_bytes += entry.media.nbytes
                self._count(local, counters)
                return Pending(self, key, None, entry, False)
            flight = self._flights.get(key)
            if flight is not None:
                flight.waiters += 1
                local.single_flight_waits += 1
                self._count(local, counters)
                return Pending(self, key, flight, None, False)
            flight = _Flight()
            self._flights[key] = flight
            local.misses += 1
            self._count(local, counters)
        flight.future = self._pool.submit(_timed, build)
        return Pending(self, key, flight, None, True)

    def get(
        self,
        key: MediaKey,
        build: Callable[[], PreparedMedia],
        deadline: float | None = None,
        counters: MediaCounters | None = None,
    ) -> MediaRef:
        """`start(key, build).result(deadline)`."""
        return self.start(key, build, counters).result(deadline, counters)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- internals ----
    def _count(self, local: MediaCounters, request: MediaCounters | None) -> None:
        self.counters.add(local)
        if request is not None:
            request.add(local)

    def _finish(
        self, key: MediaKey, flight: _Flight, deadline: float | None, counters: MediaCounters | None
    ) -> MediaRef:
        try:
            assert flight.future is not None
            media, seconds = flight.future.result()
            with self._cond:
                self._count(MediaCounters(built_bytes=media.nbytes, build_seconds=seconds), counters)
            entry = self._reserve(media, deadline)
        except BaseException as exc:
            with self._cond:
                self._flights.pop(key, None)
                flight.error = exc
            flight.done.set()
            raise
        with self._cond:
            self._flights.pop(key, None)
            entry.refs += 1 + flight.waiters  # this caller and every joined waiter
            self._retain(key, entry)
            flight.entry = entry
        flight.done.set()
        return MediaRef(self, entry)

    def _reserve(self, media: PreparedMedia, deadline: float | None) -> _Entry:
        size = media.nbytes
        if size > self.live_limit:
            raise MediaError(BUDGET_EXCEEDED, f"prepared media of {size} bytes exceeds the live media limit")
        with self._cond:
            self._wait_for_room(size, deadline)
            self._live += size
            return _Entry(media, 0)

    def _wait_for_room(self, size: int, deadline: float | None) -> None:
        """Under the lock: evict unshared retained payloads, else wait, until `size` more bytes fit."""
        while self._live + size > self.live_limit:
            if self._evict_one(unshared_only=True):
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise PreparationTimeout("waiting for live media memory timed out")
            self._cond.wait(left)

    def _retain(self, key: MediaKey, entry: _Entry) -> None:
        size = entry.media.nbytes
        if size > self.retain_limit:
            return
        while self._retained + size > self.retain_limit and self._evict_one():
            pass
        entry.refs += 1
        self._lru[key] = entry
        self._retained += size

    def _evict_one(self, unshared_only: bool = False) -> bool:
        """Drop the least recently used retained payload (only one no request holds, if asked)."""
        key = next((k for k, e in self._lru.items() if e.refs == 1 or not unshared_only), None)
        if key is None:
            return False
        entry = self._lru.pop(key)
        self._retained -= entry.media.nbytes
        self._drop(entry)
        return True

    def _drop(self, entry: _Entry) -> None:
        entry.refs -= 1
        if entry.refs == 0:
            self._live -= entry.media.nbytes
            self._cond.notify_all()

    def _unref(self, entry: _Entry) -> None:
        with self._cond:
            self._drop(entry)

    def _abandon(self, flight: _Flight) -> None:
        """A waiter gave up: take back the reference the builder will count for it."""
        with self._cond:
            if flight.entry is None:
                flight.waiters -= 1
                return
        if flight.error is None and flight.entry is not None:
            self._unref(flight.entry)


def _timed(build: Callable[[], PreparedMedia]) -> tuple[PreparedMedia, float]:
    t0 = time.perf_counter()
    return build(), time.perf_counter() - t0
