"""Client request ids: a valid `x-request-id` on the request is returned as the response's
`x-request-id` (the server's own numeric id then goes in `x-ninfer-request-id`), so a router's or
gateway's id follows the request through logs and traces."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

MAX_ID_CHARS = 128
_VALID = re.compile(r"[\x21-\x7e]{1,128}")  # visible ASCII: safe to echo in a header
OWN_ID_HEADER = "x-ninfer-request-id"


def client_request_id(environ: dict[str, Any]) -> str | None:
    """The request's `x-request-id` when it is 1..128 visible ASCII characters, else None."""
    value = environ.get("HTTP_X_REQUEST_ID")
    if not isinstance(value, str) or _VALID.fullmatch(value) is None:
        return None
    return value


class RequestIdMiddleware:
    """WSGI middleware: echoes the client's request id; without one the headers are unchanged."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        given = client_request_id(environ)
        if given is None:
            return self.app(environ, start_response)

        def _start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            out = []
            for name, value in headers:
                if name.lower() == "x-request-id":
                    out.append((OWN_ID_HEADER, value))
                else:
                    out.append((name, value))
            out.append(("x-request-id", given))
            return start_response(status, out, exc_info) if exc_info else start_response(status, out)

        return self.app(environ, _start)
