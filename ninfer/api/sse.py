"""Server-sent event framing for WSGI streams (Falcon's `resp.sse` exists only on ASGI)."""

from __future__ import annotations

import json

CONTENT_TYPE = "text/event-stream"
DONE = b"data: [DONE]\n\n"
COMMENT_PING = b": ping\n\n"


def frame(data: object, event: str | None = None) -> bytes:
    """One SSE event: an optional `event:` line and a compact one-line JSON `data:` line."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def headers() -> dict[str, str]:
    """Response headers for a stream (gunicorn adds chunked transfer encoding)."""
    return {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
