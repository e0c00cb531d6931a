"""Withhold stop strings from streamed text, matching across token boundaries."""

from __future__ import annotations


class StopFilter:
    """Emits text up to the first stop string; holds back a tail that could still start one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        if self.matched is not None:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        cut, hit = len(buf), None
        for stop in self.stops:
            at = buf.find(stop)
            if at != -1 and at < cut:
                cut, hit = at, stop
        if hit is not None:
            self.matched, self._held = hit, ""
            return buf[:cut]
        keep = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buf)), keep, -1):
                if buf.endswith(stop[:n]):
                    keep = n
                    break
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """End of output without a match: the held tail is ordinary text."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held
