"""Lifetime tickets: bound the requests alive at once (max_concurrency + max_pending_requests).

A caller reserves a ticket before preparing a prompt and releases it when the response has
been released, so preparation, engine FIFO waiting, generation and undelivered results all
count against one capacity. The ticket also carries the absolute admission deadline.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ninfer.engine.types import EngineOverloaded


@dataclass(eq=False)
class Ticket:
    id: int
    created: float  # time.monotonic() at reservation
    deadline: float  # admission must happen before this monotonic time
    _book: TicketBook | None = field(default=None, repr=False)
    released: bool = False

    def release(self) -> None:
        """Give the capacity back; idempotent."""
        if self._book is not None:
            self._book._release(self)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class TicketBook:
    """Thread-safe count of live tickets."""

    def __init__(self, capacity: int, timeout_s: float) -> None:
        self.capacity = capacity
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._live = 0
        self._next = 0

    @property
    def live(self) -> int:
        with self._lock:
            return self._live

    def reserve(self) -> Ticket:
        with self._lock:
            if self._live >= self.capacity:
                raise EngineOverloaded(
                    f"server overloaded: {self._live} requests in flight (capacity {self.capacity})"
                )
            self._live += 1
            self._next += 1
            now = time.monotonic()
            return Ticket(id=self._next, created=now, deadline=now + self.timeout_s, _book=self)

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            if not ticket.released:
                ticket.released = True
                self._live -= 1
