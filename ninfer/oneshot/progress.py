"""The loading progress line on stderr: the phase and its elapsed seconds, rewritten in place
on a terminal (a ticker thread), one line per phase otherwise."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TextIO

TICK_S = 0.25


class Progress:
    """`phase(name)` starts a phase; `done()` ends the line with the total seconds."""

    def __init__(self, stream: TextIO, prog: str, live: bool | None = None) -> None:
        self.stream = stream
        self.prog = prog
        self.live = stream.isatty() if live is None else live
        self.t0 = time.monotonic()
        self._phase = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.live:
            self._ticker = threading.Thread(target=self._tick, name="ninfer-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if kind is not None and self.live:
            self.stream.write("\n")  # leave the error on a line of its own
            self.stream.flush()

    def _line(self) -> str:
        return f"{self.prog}: {self._phase} ({time.monotonic() - self.t0:.1f} s)"

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            with self._lock:
                self.stream.write(f"\r\033[K{self._line()}")
                self.stream.flush()

    def phase(self, name: str) -> None:
        with self._lock:
            self._phase = name
            self.stream.write(f"\r\033[K{self._line()}" if self.live else f"{self._line()}\n")
            self.stream.flush()

    def done(self, what: str) -> float:
        """End the line; the seconds since the start."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        seconds = time.monotonic() - self.t0
        with self._lock:
            end = f"{self.prog}: {what} in {seconds:.1f} s"
            self.stream.write(f"\r\033[K{end}\n" if self.live else f"{end}\n")
            self.stream.flush()
        return seconds
