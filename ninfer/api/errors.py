"""API errors: one exception type and its OpenAI and Anthropic wire envelopes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

Dialect = Literal["openai", "anthropic"]

# Anthropic's error `type` per HTTP status (its SDK maps statuses to exception classes).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}

# OpenAI's error `type` per HTTP status.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


@dataclass
class ApiError(Exception):
    """An error answered to the client with an HTTP status, a stable code and the offending field."""

    status: int
    code: str
    message: str
    param: str | None = None
    type: str | None = None  # OpenAI-shape type; derived from the status when None
    retryable: bool = False  # False adds `x-should-retry: false` so SDKs do not retry
    request_id: int | None = None  # the measurement request it ended (sent as x-request-id)
    retry_after_s: int = 1  # the Retry-After header of a 429 or 503

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def openai_type(self) -> str:
        return self.type or _OPENAI_TYPES.get(self.status, "server_error")

    @property
    def anthropic_type(self) -> str:
        return _ANTHROPIC_TYPES.get(self.status, "api_error")

    def body(self, dialect: Dialect) -> dict[str, object]:
        """The JSON body of this error in the given protocol's envelope."""
        if dialect == "anthropic":
            return {"type": "error", "error": {"type": self.anthropic_type, "message": self.message}}
        return {
            "error": {
                "message": self.message,
                "type": self.openai_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body_bytes(self, dialect: Dialect) -> bytes:
        # A message or param that quotes a client's lone surrogate still encodes: as a `\udxxx`
        # escape, which keeps the body valid JSON (rendering an error must never fail itself).
        return json.dumps(self.body(dialect), ensure_ascii=False).encode("utf-8", "backslashreplace")

    def describe(self) -> dict[str, object]:
        """The exact status/type/code/param/message, as the request log records it."""
        return {
            "status": self.status,
            "type": self.openai_type,
            "code": self.code,
            "param": self.param,
            "message": self.message,
        }


def invalid(param: str | None, message: str, code: str = "invalid_request") -> ApiError:
    """A 400 for a malformed or unsupported request field."""
    return ApiError(400, code, message, param)


def unsupported(param: str, message: str) -> ApiError:
    """A 400 for a recognized field whose value this server does not implement."""
    return ApiError(400, "unsupported_parameter", message, param)


def unknown_parameter(param: str) -> ApiError:
    return ApiError(400, "unknown_parameter", f"unknown parameter: {param!r}", param)


def internal(message: str) -> ApiError:
    return ApiError(500, "internal_error", message)


def dialect_for_path(path: str) -> Dialect:
    """Anthropic routes answer Anthropic envelopes; everything else answers OpenAI's."""
    return "anthropic" if path.startswith("/v1/messages") else "openai"
