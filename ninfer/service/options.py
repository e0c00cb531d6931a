"""The HTTP worker's thread pool, sized from the settings (every other service value is read from
the settings groups where it is used)."""

from __future__ import annotations

from ninfer.config import Settings

# Threads beyond max_concurrency + max_pending for /health, /v1/models, errors and rejections.
# Requests reach a thread only once fully read (`reader_worker`), so these are never held by
# slow or idle clients.
THREAD_HEADROOM = 16


def worker_threads(settings: Settings) -> int:
    """gthread pool size: every open stream holds one thread for its whole life."""
    return settings.engine.max_concurrency + settings.engine.max_pending_requests + THREAD_HEADROOM
