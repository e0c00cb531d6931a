"""Thin wrapper over a Hugging Face ``tokenizers.Tokenizer`` loaded from ``tokenizer.json``."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer as HfTokenizer
from tokenizers import decoders

from ninfer.text.builder import byte_to_unicode

_UNICODE_TO_BYTE = {c: b for b, c in byte_to_unicode().items()}


class Tokenizer:
    """Encode text to ids and back, as the released Qwen tokenizer does.

    ``encode`` recognises added tokens (``<|im_start|>``, ``<think>``, ...) written in the text, as
    Hugging Face does for rendered chat templates, and adds no BOS. ``decode`` is the byte-level
    decode of Hugging Face: invalid UTF-8 becomes U+FFFD. Ids outside ``[0, vocab_size)`` raise.

    The text is put in NFC with Python's ``unicodedata`` before the Rust pipeline (whose own NFC
    step then changes nothing), as the reference tiktoken tokenizer does. This matters in two
    corner cases where normalizing inside the pipeline differs: the Rust tables predate Unicode
    14 (its combining classes reorder marks differently), and the pipeline normalizes the text
    between added tokens separately, so an added token followed by U+0338 would not compose.

    Thread safety: the underlying Rust tokenizer is safe to use from several threads at once for
    ``encode`` and ``decode``; the per-id byte cache only ever gains entries and is safe under the GIL.
    """

    def __init__(self, hf: HfTokenizer) -> None:
        self._hf = hf
        self._vocab_size = hf.get_vocab_size(with_added_tokens=True)
        added = hf.get_added_tokens_decoder()
        self._added_ids = tuple(sorted(added))
        self._special_ids = frozenset(i for i, tok in added.items() if tok.special)
        self._byte_level = isinstance(hf.decoder, decoders.ByteLevel)
        self._bytes: dict[int, bytes] = {}

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load a ``tokenizer.json``."""
        return cls(HfTokenizer.from_file(str(path)))

    @property
    def hf(self) -> HfTokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._hf

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (248077 for Qwen3.5/3.6)."""
        return self._vocab_size

    @property
    def added_token_ids(self) -> tuple[int, ...]:
        """Ids of all added tokens, ascending."""
        return self._added_ids

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked ``special`` (dropped by ``skip_special_tokens``)."""
        return self._special_ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; added tokens in the text are recognised."""
        return self._hf.encode(unicodedata.normalize("NFC", text), add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` for several texts, in parallel inside the Rust library."""
        normalized = [unicodedata.normalize("NFC", t) for t in texts]
        return [e.ids for e in self._hf.encode_batch(normalized, add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; with ``skip_special_tokens`` the special added tokens are left out."""
        ids = list(ids)
        self._check_ids(ids)
        return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry (byte-level spelling, e.g. ``"Ġthe"``) or added token."""
        return self._hf.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        """Vocabulary entry (byte-level spelling) of an id, or None if there is none."""
        if not 0 <= i < self._vocab_size:
            return None
        return self._hf.id_to_token(i)

    def token_bytes(self, i: int) -> bytes:
        """The bytes that id ``i`` contributes to ``decode`` (what the byte-level decoder emits)."""
        cached = self._bytes.get(i)
        if cached is not None:
            return cached
        if not self._byte_level:
            raise ValueError("token_bytes needs a tokenizer.json with a ByteLevel decoder")
        token = self.id_to_token(i)
        if token is None:
            raise ValueError(f"token id {i} is outside the vocabulary [0, {self._vocab_size})")
        try:
            data = bytes(_UNICODE_TO_BYTE[c] for c in token)
        except KeyError:
            # The ByteLevel decoder passes a token holding a character outside its alphabet through as UTF-8.
            data = token.encode("utf-8")
        self._bytes[i] = data
        return data

    def _check_ids(self, ids: list[int]) -> None:
        if ids and (min(ids) < 0 or max(ids) >= self._vocab_size):
            bad = next(i for i in ids if not 0 <= i < self._vocab_size)
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self._vocab_size})")
