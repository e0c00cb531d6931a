"""The caller's view of one submitted request: a blocking stream of StepOutputs plus stats."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

from ninfer.engine.tickets import Ticket
from ninfer.engine.types import EngineError, QueueTimeout, RequestStats, StepOutput


class RequestHandle:
    """Read on the caller's thread; the engine thread only puts outputs into it.

    Iterating yields `StepOutput`s until the one with `finish_reason`; an admission failure
    (`QueueTimeout`, `EngineStopped`) is raised from the iterator instead. `stats` is complete
    once the final output has been read.

    Until the engine admits the request, the caller's wait is bounded by the ticket's deadline
    itself, not by the engine's next step boundary (a long step would delay the 503): at the
    deadline the caller claims the request as expired, raises `QueueTimeout` and cancels it.
    Admission and expiry are one claim under a lock (`claim_admission` / `_expire`), so a
    request is either admitted or timed out, never both.
    """

    def __init__(
        self, request_id: str, ticket: Ticket, stats: RequestStats, cancel: Callable[[], None]
    ) -> None:
        self.request_id = request_id
        self.ticket = ticket
        self.stats = stats
        self._cancel = cancel
        # SimpleQueue: its put is one C call (queue.Queue's takes a Condition and a deque), and the
        # engine thread puts every token of every running request
        self._queue: queue.SimpleQueue[StepOutput | EngineError] = queue.SimpleQueue()
        self.finished = False
        self.timeout_s: float | None = None  # per-item wait bound while iterating
        self._claim = threading.Lock()
        self._admitted = False
        self._expired = False

    # ----- admission claim (engine thread / caller thread) -----
    def claim_admission(self) -> bool:
        """The engine is admitting the request: False if the caller already timed it out."""
        with self._claim:
            if self._expired:
                return False
            self._admitted = True
            return True

    def release_admission(self) -> None:
        """The claimed admission did not happen (no room yet): the request is waiting again."""
        with self._claim:
            self._admitted = False

    def _expire(self) -> bool:
        with self._claim:
            if self._admitted:
                return False
            self._expired = True
            return True

    # ----- engine side -----
    def _put(self, item: StepOutput | EngineError) -> None:
        self._queue.put(item)

    # ----- caller side -----
    def get(self, timeout: float | None = None) -> StepOutput:
        """The next output; raises `queue.Empty` after `timeout` seconds without one, and
        `QueueTimeout` once the admission deadline passes before the engine admitted the request."""
        item = self._queue.get(timeout=timeout) if self._admitted else self._get_waiting(timeout)
        if isinstance(item, EngineError):
            self.finished = True
            raise item
        if item.finish_reason is not None:
            self.finished = True
        return item

    def _get_waiting(self, timeout: float | None) -> StepOutput | EngineError:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            now = time.monotonic()
            bound = self.ticket.deadline - now if not self._admitted else None
            if end is not None:
                bound = end - now if bound is None else min(bound, end - now)
            try:
                return self._queue.get(timeout=None if bound is None else max(0.0, bound))
            except queue.Empty:
                now = time.monotonic()
                if now >= self.ticket.deadline and self._expire():
                    self.finished = True
                    self._cancel()
                    waited = now - self.ticket.created
                    raise QueueTimeout(f"request not admitted within {waited:.3f}s") from None
                if end is not None and now >= end:
                    raise

    def __iter__(self) -> Iterator[StepOutput]:
        while not self.finished:
            yield self.get(self.timeout_s)

    def cancel(self) -> None:
        """Stop generating (client gone, timeout); everything is freed at the next step boundary."""
        if not self.finished:
            self._cancel()

    def result(self, timeout: float | None = None) -> tuple[list[int], StepOutput]:
        """Block until the end: (all committed token ids, the final output)."""
        tokens: list[int] = []
        while True:
            out = self.get(timeout)
            tokens.extend(out.token_ids)
            if out.finish_reason is not None:
                return tokens, out

    def close(self) -> None:
        """Cancel if still running and release the lifetime ticket (the response is released)."""
        self.cancel()
        self.ticket.release()

    def __enter__(self) -> RequestHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Outbox:
    """The engine thread's deliveries to request handles, in order per handle.

    A round's token outputs wait in `pending` until `flush()`, which the runner calls once the
    next step's GPU work is launched: waking the callers' threads (and their Python work) then
    overlaps the GPU instead of delaying the launch. Final outputs and errors (`put_now`) first
    flush what is pending, so each handle still receives its items in order.
    """

    def __init__(self) -> None:
        self.pending: list[tuple[RequestHandle, StepOutput]] = []

    def put(self, handle: RequestHandle, out: StepOutput) -> None:
        self.pending.append((handle, out))

    def put_now(self, handle: RequestHandle, item: StepOutput | EngineError) -> None:
        self.flush()
        handle._put(item)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        for handle, out in pending:
            handle._put(out)
