"""Incremental detokenizer: streams text deltas that never split a UTF-8 character."""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from ninfer.text.tokenizer import Tokenizer

# Allowed range of the second byte after each lead byte (RFC 3629, Table 3-7 of Unicode).
_SECOND = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def _may_complete(pending: bytes) -> bool:
    """Whether `pending` (an unfinished tail of 1-3 bytes) can still become one valid character."""
    lead = pending[0]
    if 0xC2 <= lead <= 0xDF:
        need = 2
    elif 0xE0 <= lead <= 0xEF:
        need = 3
    elif 0xF0 <= lead <= 0xF4:
        need = 4
    else:
        return False
    if len(pending) >= need:
        return False
    for i, b in enumerate(pending[1:], start=1):
        lo, hi = _SECOND.get(lead, (0x80, 0xBF)) if i == 1 else (0x80, 0xBF)
        if not lo <= b <= hi:
            return False
    return True


class Utf8Stream:
    """Bytes -> text as each character completes; the concatenation equals the whole decode
    (errors -> U+FFFD, one per maximal invalid subpart, where the full decode puts them)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        """Add bytes; return the characters that became complete."""
        text = self._decoder.decode(data)
        pending = self._decoder.getstate()[0]
        if pending and not _may_complete(pending):
            # CPython's incremental decoder can hold bytes that no continuation can make valid
            # (e.g. ED A1, a surrogate); they are already U+FFFD in the full decode: emit them now.
            text += self._decoder.decode(b"", final=True)
            self._decoder.reset()
        return text

    def flush(self) -> str:
        """End of input: what is held back (an unfinished character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)

    @property
    def pending_bytes(self) -> int:
        return len(self._decoder.getstate()[0])


class IncrementalDetokenizer:
    """Turns a growing token sequence into text deltas whose concatenation equals ``decode``.

    The byte-level decode of the whole sequence is the UTF-8 decode (errors -> U+FFFD, one per
    maximal invalid subpart) of the concatenated token bytes. A streaming UTF-8 decoder over the
    same bytes therefore gives the same text, emitted as soon as each character is complete: a
    character split across tokens is held back until its last byte arrives, and an invalid byte
    run becomes U+FFFD exactly where the full decode puts it. Each ``push`` costs time
    proportional to the bytes of the new tokens only.

    With ``skip_special_tokens`` the special added tokens are dropped before their bytes are
    joined, as ``Tokenizer.decode(..., skip_special_tokens=True)`` does.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip = tokenizer.special_token_ids if skip_special_tokens else frozenset()
        self._stream = Utf8Stream()
        self._finished = False

    def push(self, ids: Sequence[int]) -> str:
        """Add tokens; return the text that became complete."""
        if self._finished:
            raise RuntimeError("push after flush")
        token_bytes = self._tokenizer.token_bytes
        return self._stream.push(b"".join(token_bytes(i) for i in ids if i not in self._skip))

    def flush(self) -> str:
        """End of sequence: return what is held back (an unfinished character becomes U+FFFD)."""
        if self._finished:
            return ""
        self._finished = True
        return self._stream.flush()

    @property
    def pending_bytes(self) -> int:
        """Bytes received but not yet emitted (0-3: an unfinished UTF-8 character)."""
        return self._stream.pending_bytes
