"""The one error type of media acquisition and preparation (HTTP 400 with a stable code)."""

from __future__ import annotations

FETCH_FAILED = "media_fetch_failed"
URL_FORBIDDEN = "media_url_forbidden"
BUDGET_EXCEEDED = "media_budget_exceeded"
INVALID_MEDIA = "invalid_media"


class MediaError(Exception):
    """A media item could not be acquired or prepared; `code` is the API error code (status 400)."""

    status = 400

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"MediaError({self.code!r}, {self.message!r})"
