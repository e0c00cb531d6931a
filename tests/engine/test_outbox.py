"""The engine's Outbox: token outputs wait for the next launch; final items flush them first, so each
handle receives its items in order."""

from __future__ import annotations

import pytest

from ninfer.engine.handle import Outbox, RequestHandle
from ninfer.engine.tickets import TicketBook
from ninfer.engine.types import EngineError, RequestStats, StepOutput


def _handle(book: TicketBook, name: str) -> RequestHandle:
    return RequestHandle(name, book.reserve(), RequestStats(), lambda: None)


def test_pending_outputs_wait_for_flush_and_finals_flush_first() -> None:
    book = TicketBook(4, 1.0)
    a, b = _handle(book, "a"), _handle(book, "b")
    box = Outbox()
    box.put(a, StepOutput(token_ids=(1,)))
    box.put(b, StepOutput(token_ids=(2,)))
    box.put(a, StepOutput(token_ids=(3,)))
    assert a._queue.empty() and b._queue.empty() and len(box.pending) == 3
    box.put_now(a, StepOutput(token_ids=(4,), finish_reason="stop"))  # the pending ones go first
    assert box.pending == []
    tokens, last = a.result(1.0)
    assert tokens == [1, 3, 4] and last.finish_reason == "stop"
    assert b.get(1.0).token_ids == (2,)
    box.put(b, StepOutput(token_ids=(5,)))
    box.flush()
    assert b.get(1.0).token_ids == (5,)
    box.put(b, StepOutput(token_ids=(6,)))
    box.put_now(b, EngineError("the engine failed"))
    assert b.get(1.0).token_ids == (6,)
    with pytest.raises(EngineError, match="failed"):
        b.get(1.0)
