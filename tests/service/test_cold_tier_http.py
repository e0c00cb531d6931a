"""The host-RAM cold tier over HTTP: a one-lane server on the CPU parks a conversation when another
takes its lane, and restores it on the conversation's next turn (the request log says so)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.service.conftest import MODEL, Server, scrape, start_server, stop_server

RESIDENT_PATHS = ("append_frontier", "restore_turn_checkpoint", "restore_response_checkpoint")


@pytest.fixture(scope="module")
def one_lane(tmp_path_factory: pytest.TempPathFactory, demo_cache: Path) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("cold"),
        [
            "engine.device=cpu",
            "engine.max_concurrency=1",
            "engine.max_context=512",
            "cold_tier.host_mib=64",
        ],
        demo_cache,
    )
    yield srv
    assert stop_server(srv) == 0, srv.stderr_path.read_text()[-3000:]


def _chat(server: Server, messages: list[dict[str, str]], rid: str) -> str:
    body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0}
    headers = {**server.headers(), "x-request-id": rid}
    r = requests.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"] or ""


def _done(server: Server, rid: str, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for e in server.events():
            if e["event"] == "request_done" and e.get("client_request_id") == rid:
                return e
        time.sleep(0.05)
    raise AssertionError(f"no request_done for {rid}")


def test_evicted_conversation_is_restored_from_host_memory(one_lane: Server) -> None:
    start = next(e for e in one_lane.events() if e["event"] == "server_start")
    tier = start["engine"]["cold_tier"]
    assert tier["capacity_bytes"] == 64 << 20 and [a["device"] for a in tier["arenas"]] == ["cpu"]
    assert "cold tier: host arena 0.06 GiB" in one_lane.stderr_path.read_text()
    a = [{"role": "user", "content": "Tell me about the sea and the ships on it."}]
    b = [{"role": "user", "content": "Something else entirely: mountains."}]
    a.append({"role": "assistant", "content": _chat(one_lane, a, "a1")})
    _chat(one_lane, b, "b1")  # takes the only lane: A is parked in host memory
    a.append({"role": "user", "content": "And the harbours?"})
    _chat(one_lane, a, "a2")
    first, other, later = _done(one_lane, "a1"), _done(one_lane, "b1"), _done(one_lane, "a2")
    assert not first["cold_tier_restored"] and not other["cold_tier_restored"]
    assert other["prefix_reuse_path"] == "full_reset" and other["cold_tier_parks"] == 1
    assert later["cold_tier_restored"] and later["prefix_reuse_path"] in RESIDENT_PATHS
    assert later["cached_tokens"] > 0 and later["cold_tier_restores"] == 1
    assert later["cold_tier_active"] and [x["device"] for x in later["cold_tier_arenas"]] == ["cpu"]
    assert later["cold_tier_restore_failures"] == later["cold_tier_park_failures"] == 0
    metrics = scrape(one_lane.url, one_lane.headers())
    assert metrics["ninfer_cold_tier_active{}"] == 1.0
    assert metrics["ninfer_cold_tier_restores_total{}"] == 1.0
