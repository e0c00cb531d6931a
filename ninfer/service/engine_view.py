"""What the service reads of the engine, as one typed protocol: the real `Engine` and the test
fake implement it, so the service never probes the engine with getattr."""

from __future__ import annotations

from typing import Any, Protocol

from ninfer.api.ports import EnginePort
from ninfer.engine.config import EngineConfig
from ninfer.engine.counters import Counters
from ninfer.engine.graphs import GraphStats
from ninfer.engine.scheduler import Snapshot
from ninfer.engine.sizing import SizingLedger
from ninfer.engine.tickets import TicketBook


class EngineView(EnginePort, Protocol):
    """The loaded engine as the service sees it: lifecycle, occupancy, counters and startup facts."""

    @property
    def config(self) -> EngineConfig:
        """The resolved narrow config."""
        ...

    @property
    def ledger(self) -> SizingLedger | None:
        """KV sizing (None: the engine holds no KV pool)."""
        ...

    @property
    def tickets(self) -> TicketBook:
        """Live lifetime tickets (running + waiting + releasing)."""
        ...

    @property
    def counters(self) -> Counters:
        """Throughput counters, taken per report interval."""
        ...

    @property
    def error(self) -> str | None:
        """Set once the engine thread died."""
        ...

    def start(self) -> EngineView:
        """Start the engine thread; returns the engine."""
        ...

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until warm-up and CUDA graph capture are done (False: failed or timed out)."""
        ...

    def snapshot(self) -> Snapshot: ...

    def graph_stats(self) -> GraphStats | None: ...

    def cold_tier_stats(self) -> dict[str, Any] | None: ...

    def late_compiles(self) -> int: ...

    def late_kernels(self) -> dict[str, int]: ...

    def shutdown(self, drain_timeout_s: float) -> None: ...
