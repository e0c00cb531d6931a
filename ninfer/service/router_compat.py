"""Bodies rewritten by routers: vLLM's router (`vllm-router`, a fork of SGLang's) re-serializes a
Chat Completions request through its typed model and adds SGLang's extension fields at their
defaults (`no_stop_trim: false`, `skip_special_tokens: true`, ...). Those values change nothing
here, so they are dropped before the strict parser sees the body; any other value of those fields
still reaches the parser and is refused as an unknown parameter."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable
from typing import Any

from ninfer.api.json_body import JsonRejected, loads

# field -> the router's serializer default (a no-op for NInfer)
ROUTER_DEFAULTS: dict[str, object] = {
    "no_stop_trim": False,
    "ignore_eos": False,
    "continue_final_message": False,
    "skip_special_tokens": True,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_hidden_states": False,
    "include_reasoning": True,
}
PATHS = frozenset({"/v1/chat/completions"})
MARKER = b'"no_stop_trim"'  # every body the router rewrote carries it


def strip_router_defaults(body: bytes) -> bytes | None:
    """The body without the router's no-op fields, or None when there is nothing to drop."""
    if MARKER not in body:
        return None
    try:
        doc = loads(body.decode("utf-8"))
    except (JsonRejected, ValueError, UnicodeDecodeError):
        return None  # the API's own parser answers the 400
    if not isinstance(doc, dict):
        return None
    drop = [k for k, v in ROUTER_DEFAULTS.items() if k in doc and doc[k] is v]
    if not drop:
        return None
    for key in drop:
        del doc[key]
    return json.dumps(doc, ensure_ascii=False).encode("utf-8")


class RouterCompatMiddleware:
    """WSGI middleware: rewrites POST bodies on `PATHS` (already read whole by the worker)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") == "POST" and environ.get("PATH_INFO") in PATHS:
            length = environ.get("CONTENT_LENGTH")
            if length and length.isdigit():
                body = environ["wsgi.input"].read(int(length))
                new = strip_router_defaults(body)
                if new is not None:
                    body = new
                environ["wsgi.input"] = io.BytesIO(body)
                environ["CONTENT_LENGTH"] = str(len(body))
        return self.app(environ, start_response)
