"""Falcon middleware: HTTP response counts, API-key auth, the raw body limit (before any JSON
parsing), error rendering."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import Any

import falcon

from ninfer.api.errors import ApiError, dialect_for_path, internal
from ninfer.service.console import logger

OPEN_PATHS = frozenset({"/", "/health", "/livez"})
_READ_CHUNK = 1 << 20


class HttpCount:
    """Count every response by route template, method and status (`observe(route, method, status)`).

    Listed first, so its `process_response` runs whatever a later component raised. A refusal
    before routing (401, 413) names the path when it is one of the `static` routes; any other
    path no route matched counts as "unmatched", so the label set stays bounded."""

    def __init__(self, observe: Callable[[str, str, int], None]) -> None:
        self._observe = observe
        self.static: frozenset[str] = frozenset()  # routes without path parameters (set by create_app)

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: object, req_succeeded: bool
    ) -> None:
        route = req.uri_template or (req.path if req.path in self.static else "unmatched")
        self._observe(route, req.method, resp.status_code)


class ApiKeyAuth:
    """Require the key as `Authorization: Bearer` or `x-api-key` everywhere but the probes, preflight
    and the `extra_open` paths (/metrics with `--metrics-open`)."""

    def __init__(self, api_key: str, extra_open: frozenset[str] = frozenset()) -> None:
        self._key = api_key.encode("utf-8")
        self._open = OPEN_PATHS | extra_open

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.method == "OPTIONS" or req.path in self._open:
            return
        given = req.get_header("x-api-key")
        if given is None:
            auth = req.get_header("Authorization") or ""
            scheme, _, token = auth.partition(" ")
            given = token.strip() if scheme.lower() == "bearer" else None
        if given is None or not hmac.compare_digest(given.encode("utf-8"), self._key):
            raise ApiError(401, "invalid_api_key", "missing or invalid API key", retryable=False)


class BodyLimit:
    """Read POST bodies into `req.context.body`, refusing more than `limit` bytes with 413.

    Content-Length is checked before reading; a chunked body is read with a bounded loop, so a
    body without a length can never be buffered beyond the limit plus one chunk.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def _too_large(self) -> ApiError:
        mib = self.limit / (1024 * 1024)
        return ApiError(413, "request_too_large", f"request body exceeds max_request_mib ({mib:g} MiB)")

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.body = b""
        if req.method not in ("POST", "PUT", "PATCH"):
            return
        try:
            req.context.body = self._read(req)
        except ApiError:
            raise
        except Exception as exc:  # the server's HTTP parser refused the body's framing
            raise ApiError(
                400, "invalid_request", f"the request body could not be read: {type(exc).__name__}: {exc}"
            ) from None

    def _read(self, req: falcon.Request) -> bytes:
        """The whole body; a malformed chunked encoding raises from the server's stream."""
        length = req.content_length
        if length is not None:
            if length > self.limit:
                raise self._too_large()
            return req.bounded_stream.read(length)
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = req.stream.read(min(_READ_CHUNK, self.limit + 1 - total))
            if not chunk:
                break
            total += len(chunk)
            if total > self.limit:
                raise self._too_large()
            chunks.append(chunk)
        return b"".join(chunks)


def render_error(resp: falcon.Response, path: str, error: ApiError) -> None:
    resp.status = falcon.code_to_http_status(error.status)
    resp.content_type = falcon.MEDIA_JSON
    resp.data = error.body_bytes(dialect_for_path(path))
    if not error.retryable:
        resp.set_header("x-should-retry", "false")
    if error.status in (429, 503):
        resp.set_header("Retry-After", str(error.retry_after_s))
    if error.request_id is not None:
        resp.set_header("x-request-id", str(error.request_id))


def handle_api_error(req: falcon.Request, resp: falcon.Response, ex: ApiError, params: Any) -> None:
    render_error(resp, req.path, ex)


def handle_http_error(req: falcon.Request, resp: falcon.Response, ex: falcon.HTTPError, params: Any) -> None:
    """Falcon's own errors (unknown route, wrong method) in the protocol's envelope."""
    status = ex.status_code
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
    message = ex.description or ex.title or "error"
    if status == 404:
        message = f"no route for {req.method} {req.path}"
    render_error(resp, req.path, ApiError(status, code, message))
    headers = ex.headers or {}
    for name, value in headers.items() if isinstance(headers, Mapping) else headers:
        resp.set_header(name, value)


def handle_unexpected(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    logger().exception("unhandled error on %s %s", req.method, req.path)
    render_error(resp, req.path, internal(f"internal error: {type(ex).__name__}"))


def install_error_handlers(app: falcon.App[Any, Any]) -> None:
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(falcon.HTTPError, handle_http_error)
    app.add_error_handler(ApiError, handle_api_error)
