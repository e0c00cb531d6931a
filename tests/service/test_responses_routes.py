"""Responses routes in-process (Falcon test client, scripted engine) with a small response store:
LRU eviction through the API and the store-capacity failure on both the JSON and the SSE path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import falcon.testing
import pytest
from fake_engine import scripted_app

from ninfer.api.responses.store import ResponseStore

MODEL = "ninfer-demo"


class NullObserver:
    def rejected(self, *args: Any) -> None: ...
    def started(self, *args: Any) -> None: ...
    def done(self, *args: Any) -> None: ...
    def failed(self, *args: Any) -> None: ...


@pytest.fixture(scope="module")
def app_parts() -> Iterator[tuple[falcon.testing.TestClient, ResponseStore]]:
    store = ResponseStore(max_records=2, max_mib=1)
    overrides = ["engine.max_context=512", "engine.default_max_tokens=64"]
    client, _ = scripted_app(overrides, NullObserver(), MODEL, response_store=store)
    yield client, store


def create(client: falcon.testing.TestClient, **body: Any) -> falcon.testing.Result:
    return client.simulate_post("/v1/responses", json={"model": MODEL, "input": "hi", **body})


def test_lru_eviction_through_the_api(app_parts: tuple[falcon.testing.TestClient, ResponseStore]) -> None:
    client, store = app_parts
    store.max_bytes = 1 << 20
    first = create(client)
    assert first.status_code == 200, first.text
    a, b = first.json["id"], create(client).json["id"]
    assert client.simulate_get(f"/v1/responses/{a}").status_code == 200  # a is now the most recent
    c = create(client).json["id"]
    assert store.ids() == [a, c]
    gone = client.simulate_get(f"/v1/responses/{b}")
    assert gone.status_code == 404 and gone.json["error"]["code"] == "response_not_found"
    r = create(client, previous_response_id=b)
    assert (r.status_code, r.json["error"]["code"]) == (400, "previous_response_not_found")
    assert create(client, previous_response_id=a).status_code == 200


def test_capacity_exceeded(app_parts: tuple[falcon.testing.TestClient, ResponseStore]) -> None:
    client, store = app_parts
    store.max_bytes = 1 << 20
    for rid in store.ids():
        store.delete(rid)
    sized = create(client, input="hi")
    full = store.get(sized.json["id"])
    assert full is not None
    # Room for the request's input but not for the generated output: generation runs, then fails.
    store.max_bytes = full.nbytes - 1
    r = create(client, input="hi")
    err = r.json["error"]
    assert (r.status_code, err["code"], err["param"]) == (400, "response_store_capacity_exceeded", "store")
    stream = create(client, input="hi", stream=True)
    events = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "response.failed"
    assert [e["type"] for e in events].count("response.failed") == 1
    assert "response_store_capacity_exceeded" in events[-1]["response"]["error"]["message"]
    assert store.get(events[-1]["response"]["id"]) is None
    # A request whose input alone can never be stored fails before any generation.
    store.max_bytes = 600
    r = create(client, input="x" * 1000)
    assert (r.status_code, r.json["error"]["code"]) == (400, "response_store_capacity_exceeded")
    # store:false is never retained and never limited by the store.
    r = create(client, input="x" * 1000, store=False)
    assert r.status_code == 200 and r.json["store"] is False and store.get(r.json["id"]) is None
