"""A non-streaming request whose client disconnects is cancelled in the engine (all three protocols)."""

from __future__ import annotations

import json
import socket
import time

import pytest
from conftest import API_KEY, MODEL, Server

MAX_TOKENS = 300
CANCEL_WITHIN_S = 3.0  # probe period 0.2 s, one engine step, the loaded test machine

PROTOCOL = {
    "/v1/chat/completions": "chat_completions",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
}
BODIES = {
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": MAX_TOKENS,
    },
    "/v1/messages": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": MAX_TOKENS,
    },
    "/v1/responses": {"model": MODEL, "input": "Tell a long story.", "max_output_tokens": MAX_TOKENS},
}


def _last_id(server: Server) -> int:
    return max((e.get("request_id") or 0 for e in server.events()), default=0)


def _wait(server: Server, event: str, after: int, timeout_s: float) -> dict | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for e in server.events():
            if e["event"] == event and (e.get("request_id") or 0) > after:
                return e
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("path", list(BODIES))
def test_non_streaming_disconnect_cancels(server: Server, path: str) -> None:
    before = _last_id(server)
    body = json.dumps(BODIES[path]).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(head.encode() + body)
    started = _wait(server, "request_start", before, 30.0)
    assert started is not None and started["protocol"] == PROTOCOL[path]
    time.sleep(0.5)  # generating
    sock.close()
    closed = time.monotonic()
    done = _wait(server, "request_done", before, 30.0)
    waited = time.monotonic() - closed
    assert done is not None and done["request_id"] == started["request_id"]
    assert done["finish_reason"] == "cancelled" and done["completion_tokens"] < MAX_TOKENS, done
    assert waited < CANCEL_WITHIN_S, waited
