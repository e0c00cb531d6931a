"""Aggregate counters for the periodic throughput report (read and reset from any thread)."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass


@dataclass
class Interval:
    prefill_tokens: int = 0  # prompt tokens computed (prefix-cache hits excluded)
    decode_tokens: int = 0  # tokens committed by decode rounds (not the prefill's first token)
    decode_rounds: int = 0
    decode_row_rounds: int = 0  # sum of batch sizes over decode rounds
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cur = Interval()
        self.total = Interval()

    def add(self, **deltas: float) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self._cur, k, getattr(self._cur, k) + v)
                setattr(self.total, k, getattr(self.total, k) + v)

    def take(self) -> Interval:
        """The deltas since the previous call."""
        with self._lock:
            out, self._cur = self._cur, Interval()
            return out
