"""The cold tier's transfer stream: park and restore copies on their own CUDA stream.

On a CUDA engine every cold-tier transfer (device <-> pinned host, the scatter into the pools)
runs on one side stream, so it overlaps the decode steps the engine runs on its own stream. The
two streams are ordered by events only where they share memory:

* `follow()` before side-stream work that reads what the engine's stream wrote (a park's gathered
  pieces; a restore's pages, last written by their previous owner);
* `keep(t)` after an asynchronous copy out of a temporary made on the engine's stream (the
  allocator must not reuse it before the copy ran), bounding the bytes of such copies in flight;
* `join()` before the engine's stream touches what side-stream work wrote (a restored lane).

All side-stream work is in one stream, so copies that share host memory (a park into extents a
restore still reads, say) are ordered by the stream itself. On the CPU every method is a no-op
and copies are synchronous.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch


class Marker:
    """A point in the transfer stream: done once every copy enqueued before it has run."""

    def __init__(self, event: Any = None) -> None:
        self.event = event  # torch.cuda.Event with timing, or None (the CPU: done when made)
        self.at = time.perf_counter()

    def done(self) -> bool:
        return self.event is None or bool(self.event.query())

    def wait(self) -> None:
        """Block the calling thread until the marker is done."""
        if self.event is not None:
            self.event.synchronize()

    def seconds_since(self, start: Marker) -> float:
        """Transfer-stream time between two done markers (wall time on the CPU)."""
        if self.event is None or start.event is None:
            return self.at - start.at
        return float(start.event.elapsed_time(self.event)) / 1000.0


class TransferStream:
    """The side stream of a CUDA engine device, or nothing on the CPU."""

    def __init__(self, device: torch.device, inflight_bytes: int = 0) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream: Any = torch.cuda.Stream(device) if self.cuda else None
        self.inflight_bytes = inflight_bytes  # bound on `keep`'s copies in flight (0: none kept)
        self._inflight: deque[tuple[Marker, int]] = deque()

    @property
    def async_copies(self) -> bool:
        """Whether a copy between a CUDA tensor and pinned memory returns before it ran."""
        return self.cuda

    def follow(self) -> None:
        """Order the work enqueued next on the side stream after the engine stream's work so far."""
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def join(self) -> None:
        """Order the engine stream's next work after the side stream's work so far."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Run the enclosed copies and kernels on the side stream."""
        if not self.cuda:
            yield
            return
        with torch.cuda.stream(self.stream):
            yield

    def mark(self) -> Marker:
        """A marker after the side-stream work enqueued so far."""
        if not self.cuda:
            return Marker()
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return Marker(event)

    def guard(self, t: torch.Tensor) -> None:
        """`t`, made on the engine stream, is used by side-stream work just enqueued: its memory is
        not reused before that work ran, even once `t` is freed."""
        if self.cuda and t.device.type == "cuda":
            t.record_stream(self.stream)

    def keep(self, t: torch.Tensor) -> None:
        """`t`, made on the engine stream, was just copied from on the side stream: guard it, and
        wait while more than `inflight_bytes` of such copies are pending."""
        if not self.cuda or t.device.type != "cuda":
            return
        self.guard(t)
        self._inflight.append((self.mark(), t.numel() * t.element_size()))
        pending = sum(n for _, n in self._inflight)
        while self._inflight and (pending > self.inflight_bytes or self._inflight[0][0].done()):
            marker, n = self._inflight.popleft()
            marker.wait()
            pending -= n
