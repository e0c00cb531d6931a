"""The incremental detokenizer against full ``decode`` for random ids and real text, any chunking."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from conftest_text import QWEN_BPE_RANKS, ours, reference
from corpus_gen import EMOJI, SPECIALS, corpus_chunks, corpus_fragments
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer.text.detok import IncrementalDetokenizer
from ninfer.text.tokenizer import Tokenizer


def _invalid_utf8_ids() -> list[int]:
    out = []
    for i in range(QWEN_BPE_RANKS):
        try:
            reference().decoder[i].decode("utf-8")
        except UnicodeDecodeError:
            out.append(i)
    return out


INVALID_IDS = _invalid_utf8_ids()  # lone bytes 0x80-0xff and multi-byte pieces of characters
ADDED_IDS = list(range(QWEN_BPE_RANKS, QWEN_BPE_RANKS + 33))
FRAGMENTS = corpus_fragments(seed=3, count=1000)

token_id = st.one_of(
    st.integers(0, QWEN_BPE_RANKS + 32),
    st.sampled_from(INVALID_IDS),
    st.sampled_from(ADDED_IDS),
)
random_ids = st.lists(token_id, max_size=40)
real_text = st.lists(
    st.one_of(
        st.sampled_from(FRAGMENTS), st.sampled_from(EMOJI), st.sampled_from(SPECIALS), st.text(max_size=5)
    ),
    max_size=10,
).map("".join)
text_ids = real_text.map(lambda t: ours().encode(t))
cuts = st.lists(st.integers(0, 6), max_size=40)  # sizes of successive push calls (0 = empty push)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _has_surrogate(s: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in s)


def check_stream(ids: Sequence[int], sizes: Sequence[int], skip: bool) -> None:
    """Push ``ids`` in chunks of ``sizes`` (rest in one push) and check every delta and the total."""
    tok = ours()
    full = tok.decode(ids, skip_special_tokens=skip)
    det = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    emitted, pos = "", 0
    for size in [*sizes, len(ids)]:
        chunk = ids[pos : pos + size]
        pos += len(chunk)
        delta = det.push(chunk)
        assert not _has_surrogate(delta)
        emitted += delta
        # Everything emitted stays: it is the start of the final text, U+FFFD included.
        assert full.startswith(emitted), (emitted, full)
        # Only an unfinished character is held back: it shows as one trailing U+FFFD in decode(prefix).
        now = tok.decode(ids[:pos], skip_special_tokens=skip)
        assert emitted == now or (now.endswith("\ufffd") and emitted == now[:-1]), (emitted, now)
        assert 0 <= det.pending_bytes <= 3
    tail = det.flush()
    assert not _has_surrogate(tail)
    assert emitted + tail == full
    assert det.flush() == ""


@SETTINGS
@given(random_ids, cuts, st.booleans())
def test_random_ids_stream_to_the_full_decode(ids: list[int], sizes: list[int], skip: bool) -> None:
    check_stream(ids, sizes, skip)


@SETTINGS
@given(text_ids, cuts, st.booleans())
def test_text_ids_stream_to_the_full_decode(ids: list[int], sizes: list[int], skip: bool) -> None:
    check_stream(ids, sizes, skip)


@SETTINGS
@given(random_ids)
def test_full_decode_equals_the_reference_decode(ids: list[int]) -> None:
    # The byte-level decode (invalid UTF-8 -> U+FFFD per maximal subpart) agrees with tiktoken's.
    assert ours().decode(ids) == reference().decode(ids)


@pytest.mark.parametrize(
    ("pieces", "deltas"),
    [
        # "你" = e4 bd a0, split over three byte tokens: nothing until the last byte.
        ([[b"\xe4"], [b"\xbd"], [b"\xa0"]], ["", "", "你"]),
        # A truncated character followed by ASCII: one U+FFFD, then the letter.
        ([[b"\xe4", b"\xbd"], [b"A"]], ["", "\ufffdA"]),
        # A lone continuation byte is invalid at once.
        ([[b"\x80"], [b"B"]], ["\ufffd", "B"]),
    ],
)
def test_known_byte_sequences(pieces: list[list[bytes]], deltas: list[str]) -> None:
    ranks = reference()._mergeable_ranks
    det = IncrementalDetokenizer(ours())
    got = [det.push([ranks[b] for b in step]) for step in pieces]
    assert got == deltas
    assert det.flush() == ""


def test_unfinished_character_at_the_end_flushes_as_replacement() -> None:
    ranks = reference()._mergeable_ranks
    det = IncrementalDetokenizer(ours())
    assert det.push([ranks[b"a"], ranks[b"\xf0"], ranks[b"\x9f"]]) == "a"
    assert det.pending_bytes == 2
    assert det.flush() == "\ufffd" == ours().decode([ranks[b"\xf0"], ranks[b"\x9f"]])
    with pytest.raises(RuntimeError):
        det.push([1])


def test_skip_special_tokens_joins_bytes_around_a_skipped_token() -> None:
    ranks = reference()._mergeable_ranks
    ids = [ranks[b"\xe4"], ranks[b"\xbd"], 248046, ranks[b"\xa0"]]
    for skip, want in ((False, "\ufffd<|im_end|>\ufffd"), (True, "你")):
        det = IncrementalDetokenizer(ours(), skip_special_tokens=skip)
        assert det.push(ids) + det.flush() == ours().decode(ids, skip_special_tokens=skip) == want


def test_out_of_vocabulary_id_raises() -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        IncrementalDetokenizer(ours()).push([ours().vocab_size])


class _CountingTokenizer:
    """The tokenizer, counting the token byte lookups a detokenizer makes."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.lookups = 0
        self.special_token_ids = tok.special_token_ids

    def token_bytes(self, token_id: int) -> bytes:
        self.lookups += 1
        return self.tok.token_bytes(token_id)


def test_one_token_at_a_time_is_linear() -> None:
    """Linear in work, not in seconds (a timing bound would depend on the machine's load): each
    token's bytes are looked up once, and at most one unfinished character is ever held, so a
    push never revisits earlier output."""
    tok = ours()
    ids: list[int] = []
    for chunk in corpus_chunks(seed=4, min_bytes=200_000):
        ids.extend(tok.encode(chunk))
    counting = _CountingTokenizer(tok)
    det = IncrementalDetokenizer(counting)  # type: ignore[arg-type]
    out, held = [], 0
    for i in ids:
        out.append(det.push([i]))
        held = max(held, det.pending_bytes)
    out.append(det.flush())
    assert "".join(out) == tok.decode(ids)
    assert counting.lookups == len(ids) and held <= 3, (counting.lookups, len(ids), held)


def test_bytes_that_can_never_complete_are_not_held() -> None:
    """a0 ed | a1: after the second push `ed a1` (a surrogate lead) can never become a character,
    so it is emitted as U+FFFD at once, exactly as the full decode of the prefix shows it."""
    tok = ours()
    assert tok.token_bytes(55246) == b"\xa0\xed" and tok.token_bytes(94) == b"\xa1"
    det = IncrementalDetokenizer(tok)
    assert det.push([55246]) == "\ufffd"
    assert det.push([94]) == "\ufffd\ufffd" and det.pending_bytes == 0
    assert det.flush() == ""
