"""Stop handling: stop token ids and stop strings matched across token boundaries.

The engine commits token ids; when the engine has a detokenizer it also produces the exact
visible text of each step (`StepOutput.text`): text that could still be the start of a stop
string is held back until it is disambiguated, and a matched stop string and everything after
it are never emitted. The token that completed a stop string is committed (it counts as a
generated token) even though its text is withheld.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Detokenizer(Protocol):
    """Incremental detokenizer (`ninfer.text.detok.IncrementalDetokenizer`)."""

    def push(self, ids: Sequence[int]) -> str: ...

    def flush(self) -> str: ...


@dataclass(frozen=True)
class StopHit:
    token_id: int | None = None  # a stop token id ended the request
    string: str | None = None  # a stop string ended the request


class StopChecker:
    """Per-request stop state. `push` each committed token, in order."""

    def __init__(
        self,
        stop_token_ids: frozenset[int],
        stop_strings: tuple[str, ...],
        detokenizer: Detokenizer | None,
    ) -> None:
        strings = tuple(s for s in stop_strings if s)
        if strings and detokenizer is None:
            raise ValueError("stop strings need a detokenizer; the engine was built without a tokenizer")
        self.stop_token_ids = stop_token_ids
        self.strings = strings
        self.detok = detokenizer
        self._max_len = max((len(s) for s in strings), default=0)
        self._text = ""  # all decoded text so far
        self._emitted = 0  # characters of _text already returned as visible

    def push(self, token: int) -> tuple[str | None, StopHit | None]:
        """Returns (visible text delta or None without a detokenizer, stop hit or None)."""
        if token in self.stop_token_ids:
            return self.flush(), StopHit(token_id=token)
        if self.detok is None:
            return None, None
        before = len(self._text)
        self._text += self.detok.push([token])
        if not self.strings:
            return self._take(len(self._text)), None
        start = max(0, before - self._max_len + 1)
        best: tuple[int, str] | None = None
        for s in self.strings:
            i = self._text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            return self._take(best[0]), StopHit(string=best[1])
        return self._take(len(self._text) - self._held_suffix()), None

    def flush(self) -> str | None:
        """Release held-back text (the request ended for a reason other than a stop string)."""
        if self.detok is None:
            return None
        self._text += self.detok.flush()
        return self._take(len(self._text))

    def _held_suffix(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        text = self._text
        for k in range(min(self._max_len - 1, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.strings):
                return k
        return 0

    def _take(self, end: int) -> str:
        end = max(end, self._emitted)
        out = self._text[self._emitted : end]
        self._emitted = end
        return out
