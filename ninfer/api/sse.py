"""Server-sent event framing for WSGI streams (Falcon's `resp.sse` exists only on ASGI)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

from ninfer.api.errors import ApiError, internal

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


def openai_stream(frames: Iterator[bytes], close: Callable[[], None], what: str) -> Iterator[bytes]:
    """An OpenAI-style SSE body: `frames`, then `[DONE]`; a failure after the first byte becomes
    an in-band error frame (then `[DONE]`); `close` runs however the stream ends."""
    try:
        yield from frames
        yield DONE
    except ApiError as exc:
        yield frame(exc.body("openai"))
        yield DONE
    except Exception as exc:
        logging.getLogger("ninfer.api").exception("%s stream failed", what)
        yield frame(internal(f"internal error: {type(exc).__name__}").body("openai"))
        yield DONE
    finally:
        close()
