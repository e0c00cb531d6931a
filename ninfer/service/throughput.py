"""The periodic throughput report: interval token deltas and rates plus the scheduler snapshot."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, is_dataclass
from typing import Any

from ninfer.service.console import logger
from ninfer.service.request_log import RequestLog

# Cumulative engine counters the report turns into interval deltas (absent ones count as 0).
COUNTERS = ("prefill_tokens", "decode_tokens", "decode_rounds", "decode_row_rounds")


def _as_dict(snapshot: Any) -> dict[str, Any]:
    if snapshot is None:
        return {}
    if is_dataclass(snapshot) and not isinstance(snapshot, type):
        return asdict(snapshot)
    return dict(snapshot) if isinstance(snapshot, dict) else dict(vars(snapshot))


class ThroughputReporter:
    """Every `interval_ms`, one console line and one `throughput` event; idle zero intervals are omitted."""

    def __init__(self, engine: Any, log: RequestLog, interval_ms: int) -> None:
        self.engine = engine
        self.log = log
        self.interval_s = interval_ms / 1000.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ninfer-throughput", daemon=True)
        self._last = self._read()
        self._last_t = time.monotonic()

    def _read(self) -> dict[str, Any]:
        snapshot = getattr(self.engine, "snapshot", None)
        return _as_dict(snapshot()) if callable(snapshot) else {}

    def start(self) -> None:
        if self.interval_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.report()

    def report(self) -> dict[str, Any] | None:
        now, snap = time.monotonic(), self._read()
        dt = now - self._last_t
        deltas = {k: int(snap.get(k, 0)) - int(self._last.get(k, 0)) for k in COUNTERS}
        self._last, self._last_t = snap, now
        busy = any(int(snap.get(k, 0)) for k in ("running", "prefilling", "decode_ready", "waiting"))
        if not busy and not any(deltas.values()):
            return None
        rounds = deltas["decode_rounds"]
        event = {
            "interval_seconds": dt,
            **deltas,
            "prefill_tokens_per_second": deltas["prefill_tokens"] / dt if dt > 0 else 0.0,
            "decode_tokens_per_second": deltas["decode_tokens"] / dt if dt > 0 else 0.0,
            "avg_decode_batch": deltas["decode_row_rounds"] / rounds if rounds else 0.0,
            "scheduler": {k: v for k, v in snap.items() if k not in COUNTERS},
        }
        self.log.emit("throughput", **event)
        logger().info(
            "throughput: prefill %.1f tok/s, decode %.1f tok/s, batch %.2f, running %s, waiting %s",
            event["prefill_tokens_per_second"],
            event["decode_tokens_per_second"],
            event["avg_decode_batch"],
            snap.get("running", "?"),
            snap.get("waiting", "?"),
        )
        return event
