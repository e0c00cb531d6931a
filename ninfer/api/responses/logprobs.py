"""Responses `output_text` logprobs: which generated tokens produced which answer text.

The pipeline reports each engine step's tokens (`LogprobsDelta`, OpenAI's entry shape) before
that step's text; the output parser says where each piece of answer text lies in the output
(`TextDelta.start`, in characters). A token's span is the characters its bytes complete, decoded
as the engine's detokenizer decodes them, so both count positions in the same text. A token
goes with the first text delta its span touches; a token that completes no character (the first
bytes of a split character) goes with the delta holding that character. Tokens whose characters
are all reasoning or markup (the think tags, tool-call blocks and the whitespace the parser drops
around them) belong to no text part and are never shown.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from ninfer.engine.config import MAX_LOGPROBS
from ninfer.text.detok import Utf8Stream

TOP_LOGPROBS_MAX = MAX_LOGPROBS  # alternatives per token (OpenAI's bound, and the engine's)


class TextLogprobs:
    """Logprob entries of the generated tokens, handed out per answer-text delta."""

    def __init__(self) -> None:
        self._utf8 = Utf8Stream()
        self._at = 0  # characters completed so far
        self._pending: deque[tuple[int, int, dict[str, Any]]] = deque()  # (start, end, entry)

    def add(self, entries: Sequence[dict[str, Any]]) -> None:
        """One step's entries, in order (a withheld stop token is not among them)."""
        for entry in entries:
            start = self._at
            self._at += len(self._utf8.push(bytes(entry["bytes"])))
            self._pending.append((start, self._at, entry))

    def take(self, start: int, text: str) -> list[dict[str, Any]]:
        """The entries of the tokens behind `text`, which begins at character `start`; the tokens
        before it that no text delta took (reasoning, markup) are dropped."""
        end = start + len(text)
        taken: list[dict[str, Any]] = []
        while self._pending:
            a, b, entry = self._pending[0]
            if a >= end:
                break
            self._pending.popleft()
            if max(b, a + 1) > start:
                taken.append(entry)
        return taken


def event_entries(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries as the text delta / done events carry them: no `bytes` (OpenAI's event shape)."""
    return [
        {
            "token": e["token"],
            "logprob": e["logprob"],
            "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]],
        }
        for e in entries
    ]


def without_logprobs(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output Items as a continuation's context keeps them: the text parts' logprobs emptied
    (a later turn replays only the text; the stored Response keeps what it returned)."""
    out = []
    for item in items:
        parts = item.get("content")
        if item.get("type") == "message" and parts and any(p.get("logprobs") for p in parts):
            item = {**item, "content": [{**p, "logprobs": []} if "logprobs" in p else p for p in parts]}
        out.append(item)
    return out
