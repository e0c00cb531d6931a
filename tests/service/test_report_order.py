"""A request is logged while its lifetime ticket is still live: the throughput reporter counts a
live ticket as activity, so the report that shows the server settled always comes after the
request's `request_done` / `request_error` line (a request released before it was logged could
leave its line after the last report, and a reader waiting for a settled report after it would
wait forever)."""

from __future__ import annotations

from typing import Any

import falcon.testing
import pytest
from fake_engine import FakeEngine, scripted_app

MODEL = "ninfer-demo"


class TicketsAtReport:
    """Records the engine's live tickets at each report."""

    def __init__(self) -> None:
        self.engine: FakeEngine | None = None
        self.seen: list[tuple[str, int]] = []

    def _live(self) -> int:
        assert self.engine is not None
        return self.engine.tickets.live

    def rejected(self, *args: Any) -> None:
        self.seen.append(("rejected", self._live()))

    def started(self, *args: Any) -> None: ...

    def done(self, *args: Any) -> None:
        self.seen.append(("done", self._live()))

    def failed(self, *args: Any) -> None:
        self.seen.append(("failed", self._live()))


@pytest.fixture(scope="module")
def parts() -> tuple[falcon.testing.TestClient, FakeEngine, TicketsAtReport]:
    observer = TicketsAtReport()
    client, engine = scripted_app(["engine.max_context=512", "engine.default_max_tokens=8"], observer, MODEL)
    observer.engine = engine
    return client, engine, observer


@pytest.mark.parametrize("stream", [False, True])
def test_a_finished_request_is_logged_before_its_ticket_goes(parts: Any, stream: bool) -> None:
    client, engine, observer = parts
    before = len(observer.seen)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    r = client.simulate_post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert observer.seen[before:] == [("done", 1)]
    assert engine.tickets.live == 0


def test_a_rejected_request_is_logged_before_its_ticket_goes(parts: Any) -> None:
    client, engine, observer = parts
    before = len(observer.seen)
    body = {"model": MODEL, "messages": [{"role": "user", "content": " x" * 1000}]}
    r = client.simulate_post("/v1/chat/completions", json=body)  # over the 512-token context
    assert r.status_code == 400, r.text
    assert observer.seen[before:] == [("rejected", 1)]
    assert engine.tickets.live == 0
