"""The periodic throughput report: interval token deltas and rates plus the scheduler snapshot."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from typing import Any, Protocol

from ninfer.service.console import logger
from ninfer.service.engine_view import EngineView
from ninfer.service.request_log import RequestLog

# Interval deltas the engine's `counters.take()` returns (raw counts and engine compute seconds).
COUNTS = ("prefill_tokens", "decode_tokens", "decode_rounds", "decode_row_rounds")
SECONDS = ("prefill_seconds", "decode_seconds")
BUSY = ("running", "prefilling", "decode_ready", "waiting")


class MediaBytes(Protocol):
    """The prepared-media accounting the report reads (`ninfer.media.cache.MediaCache`)."""

    def byte_counts(self) -> tuple[int, int]: ...  # (live, retained): referenced by anything, LRU-held


def _as_dict(value: Any) -> dict[str, Any]:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return dict(value)


def scheduler_state(engine: EngineView) -> dict[str, Any]:
    """The engine's scheduler snapshot plus the live lifetime tickets (requests not yet released)."""
    return {**_as_dict(engine.snapshot()), "live_tickets": engine.tickets.live}


class ThroughputReporter:
    """Every `interval_ms`, one console line and one `throughput` event.

    Fully idle zero intervals are omitted; the first interval that ends idle after activity is
    still reported, so the log always holds the state the engine settled in. With --vision the
    event carries the media cache's live and retained bytes, and payloads held beyond the
    retained ones (by requests or the engine) count as activity, so the report goes on until
    the live bytes are back at the retained level.
    """

    def __init__(
        self,
        engine: EngineView,
        log: RequestLog,
        interval_ms: int,
        media: MediaBytes | None = None,
        compat: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.engine = engine
        self.compat = compat  # --client-compat adjustments counted since the last interval
        self.media = media
        self.log = log
        self.interval_s = interval_ms / 1000.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ninfer-throughput", daemon=True)
        self._lock = threading.Lock()
        self.engine.counters.take()  # start the first interval now
        self._last_t = time.monotonic()
        self._was_busy = False

    def start(self) -> None:
        if self.interval_s > 0:
            self._thread.start()

    def stop(self) -> None:
        """Stop the timer and report the final interval."""
        self._stop.set()
        self.report()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.report()

    def report(self) -> dict[str, Any] | None:
        with self._lock:
            now = time.monotonic()
            deltas = _as_dict(self.engine.counters.take())
            snap = scheduler_state(self.engine)
            dt, self._last_t = now - self._last_t, now
            busy = any(int(snap.get(k, 0)) for k in BUSY) or bool(snap.get("live_tickets"))
            media: dict[str, int] = {}
            if self.media is not None:
                live, retained = self.media.byte_counts()
                media = {"media_live_bytes": live, "media_cached_bytes": retained}
                busy = busy or live > retained  # payloads still held by requests or the engine
            was_busy, self._was_busy = self._was_busy, busy
            compat = self.compat() if self.compat is not None else {}
            if not busy and not was_busy and not compat and not any(deltas.get(k) for k in COUNTS):
                return None
            rounds = int(deltas.get("decode_rounds", 0))
            event: dict[str, Any] = {
                "interval_seconds": dt,
                **{k: int(deltas.get(k, 0)) for k in COUNTS},
                **{k: float(deltas.get(k, 0.0)) for k in SECONDS},
                "prefill_tokens_per_second": deltas.get("prefill_tokens", 0) / dt if dt > 0 else 0.0,
                "decode_tokens_per_second": deltas.get("decode_tokens", 0) / dt if dt > 0 else 0.0,
                "avg_decode_batch": deltas.get("decode_row_rounds", 0) / rounds if rounds else 0.0,
                "scheduler": snap,
                "compat_adjustment_counts": compat,
                **media,
            }
            tier = self.engine.cold_tier_stats()
            if (
                tier is not None
            ):  # the cold tier (secondary GPUs or host memory) is active: counters and arena occupancy
                event["cold_tier"] = tier
            self.log.emit("throughput", **event)
        logger().info(
            "throughput: prefill %.1f tok/s, decode %.1f tok/s, batch %.2f, running %s, waiting %s, "
            "free pages %s/%s, compat adjustments %d",
            event["prefill_tokens_per_second"],
            event["decode_tokens_per_second"],
            event["avg_decode_batch"],
            snap.get("running", "?"),
            snap.get("waiting", "?"),
            snap.get("free_pages", "?"),
            snap.get("total_pages", "?"),
            sum(compat.values()),
        )
        return event
