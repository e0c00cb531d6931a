"""Bounded JSON decoding of client text: depth, lone surrogates, non-standard constants."""

from __future__ import annotations

import json

import pytest

from ninfer.api.json_body import MAX_DEPTH, JsonRejected, loads, max_depth


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ("[]", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('["[[[[", "{{{{"]', 1),  # brackets inside strings do not count
        ('["\\"[[[", "\\\\", [[]]]', 3),  # escaped quotes and backslashes end strings correctly
        ("[" * 10 + "]" * 10 + "[[]]", 10),
        ("[[[", 3),  # malformed: still the depth a decoder would reach
    ],
)
def test_max_depth(text: str, depth: int) -> None:
    assert max_depth(text) == depth


def test_depth_limit_is_exact_and_never_recurses() -> None:
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert json.dumps(loads(ok)) == ok.replace("][", "], [")
    for deep in ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), '{"a":' * 100_000 + "1" + "}" * 100_000):
        with pytest.raises(JsonRejected, match=f"deeper than {MAX_DEPTH}"):
            loads(deep)
    with pytest.raises(JsonRejected):  # unbalanced and huge: refused by the scan, not the decoder
        loads("[" * 1_000_000)
    big = json.dumps({"s": "[" * 1_000_000, "l": [[1]] * 1000})  # many brackets inside strings
    assert loads(big)["s"] == "[" * 1_000_000


@pytest.mark.parametrize(
    "text",
    [
        '"H\\ud800i"',
        '["x", {"k": "\\udfff"}]',
        '{"H\\ud800i": 1}',
        '"\\ude00\\ud83d"',  # a pair in the wrong order is two lone surrogates
        '"a\ud800"',  # a raw surrogate in text that did not come from strict UTF-8
    ],
)
def test_lone_surrogates_are_refused(text: str) -> None:
    with pytest.raises(JsonRejected, match="surrogate"):
        loads(text)


def test_valid_pairs_and_escaped_backslashes_pass() -> None:
    assert loads('"\\ud83d\\ude00"') == "\U0001f600"
    assert loads('"\\\\ud800"') == "\\ud800"  # a backslash, then the text "ud800"
    assert loads('{"\\u00e9": "\\uffff\\u0000"}') == {"\u00e9": "\uffff\x00"}


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"t": -Infinity}'])
def test_non_standard_constants_are_refused(text: str) -> None:
    with pytest.raises(JsonRejected, match="not a JSON value"):
        loads(text)


def test_ordinary_errors_stay_value_errors() -> None:
    with pytest.raises(ValueError) as info:
        loads("{not json")
    assert not isinstance(info.value, JsonRejected)
    assert loads("-0.0") == 0.0 and loads("1e308") == 1e308 and loads("1" * 100) == int("1" * 100)
