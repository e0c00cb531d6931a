"""Incremental detokenizer: streams text deltas that never split a UTF-8 character."""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from ninfer.text.tokenizer import Tokenizer


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
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._finished = False

    def push(self, ids: Sequence[int]) -> str:
        """Add tokens; return the text that became complete."""
        if self._finished:
            raise RuntimeError("push after flush")
        token_bytes = self._tokenizer.token_bytes
        data = b"".join(token_bytes(i) for i in ids if i not in self._skip)
        return self._decoder.decode(data)

    def flush(self) -> str:
        """End of sequence: return what is held back (an unfinished character becomes U+FFFD)."""
        if self._finished:
            return ""
        self._finished = True
        return self._decoder.decode(b"", final=True)

    @property
    def pending_bytes(self) -> int:
        """Bytes received but not yet emitted (0-3: an unfinished UTF-8 character)."""
        return len(self._decoder.getstate()[0])
