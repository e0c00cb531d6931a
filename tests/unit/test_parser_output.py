"""Output parser: split invariance, no byte lost, template round trip, typed arguments, token counts."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from conftest_text import ours
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer.frontend.conversation import Tool, ToolCall
from ninfer.frontend.parser import (
    Event,
    OutputParser,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    parse_text,
)
from ninfer.frontend.render import render_template
from ninfer.frontend.toolcall import type_value
from ninfer.templates import read_template
from ninfer.text.detok import IncrementalDetokenizer

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TOOLS = [
    Tool("f", "d", {
        "type": "object",
        "properties": {
            "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
            "b": {"type": "boolean"}, "a": {"type": "array"}, "o": {"type": "object"},
            "sn": {"type": ["string", "null"]}, "any": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        },
    }),
    Tool("g", None, {"type": "object", "properties": {"q": {"type": "string"}}}),
]  # fmt: skip

# Pieces of markup and text; no piece (or join of pieces) can form "</function>", so no tool
# block in a stream made of them is well formed.
FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<function=f>", "<parameter=s>", "</parameter>", "<tool_", "call>",
    "</tool", "_call>", "\n", "\n\n", " ", "x", "yz", "é", "日本", "🎉", "</think>", "<think>", "</thi",
    "nk>", "\t",
]  # fmt: skip

SAFE_TEXT = st.text(st.sampled_from(list('ab \n<>/=é日{}[]"0')), max_size=12).filter(
    lambda s: "</parameter>" not in s
)


def counter_ids() -> Any:
    it = itertools.count()
    return lambda: f"call_{next(it)}"


def run(chunks: list[str], thinking: bool, tools: list[Tool] | None) -> tuple[list[Event], Any]:
    parser = OutputParser(thinking=thinking, tools=tools, call_id=counter_ids())
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed_text(chunk)
    events += parser.finish()
    return events, parser.result


def coalesce(events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for e in events:
        if out and isinstance(e, (TextDelta, ReasoningDelta)) and type(out[-1]) is type(e):
            out[-1] = type(e)(out[-1].text + e.text)
        else:
            out.append(e)
    return out


def check_consistent(events: list[Event], result: Any) -> None:
    assert all(not isinstance(e, (TextDelta, ReasoningDelta)) or e.text for e in events)
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == result.reasoning
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == result.content
    ends = [e.call for e in events if isinstance(e, ToolCallEnd)]
    assert ends == result.tool_calls
    for i, call in enumerate(ends):
        starts = [e for e in events if isinstance(e, ToolCallStart) and e.index == i]
        assert [(s.id, s.name) for s in starts] == [(call.id, call.name)]
        args = "".join(
            e.json_fragment for e in events if isinstance(e, ToolCallArgumentsDelta) and e.index == i
        )
        assert json.loads(args) == call.arguments


def check_starts(fed: str, events: list[Event]) -> None:
    """Each text delta is the run of the fed output its `start` names, in order, never overlapping."""
    end = 0
    for e in events:
        if isinstance(e, TextDelta):
            assert e.start >= end and fed[e.start : e.start + len(e.text)] == e.text
            end = e.start + len(e.text)


def splits(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def oracle(text: str, thinking: bool) -> tuple[str, str]:
    """(reasoning, content) of a stream with no well-formed tool block, by the documented rules."""
    if not thinking:
        return "", text
    end = text.find("</think>")
    if end < 0:
        return text, ""
    reasoning = text[:end]
    reasoning = reasoning[:-1] if reasoning.endswith("\n") else reasoning
    rest = text[end + len("</think>") :]
    for _ in range(2):
        rest = rest[1:] if rest.startswith("\n") else rest
    return reasoning, rest


@SETTINGS
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=30), st.data(), st.booleans(), st.booleans())
def test_malformed_markup_loses_no_byte_under_any_split(
    pieces: list[str], data: Any, thinking: bool, with_tools: bool
) -> None:
    text = "".join(pieces)
    tools = TOOLS if with_tools else None
    whole_events, whole = run([text], thinking, tools)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    for chunks in (splits(text, cuts), pieces, list(text)):
        split_events, split = run(chunks, thinking, tools)
        assert coalesce(split_events) == coalesce(whole_events)
        check_consistent(split_events, split)
        check_starts(text, split_events)
    assert (whole.reasoning, whole.content) == oracle(text, thinking)
    assert whole.tool_calls == []


def value_for(prop: str, draw: Any) -> Any:
    scalars = st.one_of(st.integers(-99, 99), st.booleans(), st.none(), SAFE_TEXT)
    strategies = {
        "s": SAFE_TEXT,
        "i": st.integers(-(10**12), 10**12),
        "n": st.one_of(st.integers(-99, 99), st.floats(allow_nan=False, allow_infinity=False, width=32)),
        "b": st.booleans(),
        "a": st.lists(scalars, max_size=3),
        "o": st.dictionaries(st.sampled_from(["k", "ü", "z"]), scalars, max_size=3),
        "sn": st.one_of(st.none(), SAFE_TEXT.filter(lambda s: s.strip() not in ("null", "None"))),
        "any": st.integers(-5, 5),
        "q": SAFE_TEXT,
    }
    return draw(strategies[prop])


@st.composite
def assistant_turns(draw: Any) -> dict[str, Any]:
    reasoning = draw(SAFE_TEXT)
    content = draw(SAFE_TEXT)
    calls = []
    for _ in range(draw(st.integers(0, 3))):
        tool = draw(st.sampled_from(TOOLS))
        props = list(tool.parameters["properties"])
        chosen = draw(st.lists(st.sampled_from(props), unique=True, max_size=len(props)))
        calls.append((tool.name, {p: value_for(p, draw) for p in chosen}))
    return {"reasoning": reasoning, "content": content, "calls": calls}


def render_turn(template_name: str, turn: dict[str, Any]) -> str:
    """The model output that the official template's history form of `turn` corresponds to."""
    tool_calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in turn["calls"]]
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": turn["content"],
            "reasoning_content": turn["reasoning"],
            "tool_calls": tool_calls,
        },
    ]
    text = render_template(read_template(template_name), messages)
    head = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert text.startswith(head) and text.endswith("<|im_end|>\n")
    return text[len(head) : -len("<|im_end|>\n")]


@SETTINGS
@given(assistant_turns(), st.data(), st.sampled_from(["qwen3_5", "qwen3_6"]))
def test_template_history_form_round_trips(turn: dict[str, Any], data: Any, name: str) -> None:
    output = render_turn(name, turn)
    whole_events, _ = run([output], True, TOOLS)
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=10))
    for chunks in (splits(output, cuts), list(output)):
        events, result = run(chunks, True, TOOLS)
        assert coalesce(events) == coalesce(whole_events)
        check_consistent(events, result)
        check_starts(output, events)
    assert result.reasoning == turn["reasoning"].strip()
    assert result.content == turn["content"].strip()
    assert [(c.name, c.arguments) for c in result.tool_calls] == turn["calls"]
    assert [c.id for c in result.tool_calls] == [f"call_{i}" for i in range(len(turn["calls"]))]


def test_streaming_holds_only_an_ambiguous_suffix() -> None:
    p = OutputParser(thinking=False, tools=TOOLS, call_id=counter_ids())
    assert p.feed_text("Hello wor") == [TextDelta("Hello wor")]
    assert p.feed_text("ld \n<tool_") == [TextDelta("ld")]
    assert p.feed_text("x") == [TextDelta(" \n<tool_x")]
    assert p.feed_text("\n\n<tool_call>\n<function=g>\n<parameter=q>\n1\n</parameter>\n") == []
    done = p.feed_text("</function>\n</tool_call>")
    call = ToolCall("call_0", "g", {"q": "1"})
    assert done == [
        ToolCallStart(0, "call_0", "g"),
        ToolCallArgumentsDelta(0, '{"q": "1"}'),
        ToolCallEnd(0, call),
    ]
    assert p.feed_text("\n") == [] and p.finish() == []
    assert p.result.content == "Hello world \n<tool_x"


def test_tool_call_inside_reasoning_is_reasoning_text() -> None:
    block = "<tool_call>\n<function=g>\n</function>\n</tool_call>"
    r = parse_text(f"think {block}\n</think>\n\nok", thinking=True, tools=TOOLS)
    assert (r.reasoning, r.content, r.tool_calls) == (f"think {block}", "ok", [])


def test_unterminated_and_nested_blocks_fall_back_to_text() -> None:
    r = parse_text("a\n\n<tool_call>\n<function=g>\n", thinking=False, tools=TOOLS)
    assert (r.content, r.tool_calls) == ("a\n\n<tool_call>\n<function=g>\n", [])
    good = "<tool_call>\n<function=g>\n</function>\n</tool_call>"
    r = parse_text(f"<tool_call>oops {good}", thinking=False, tools=TOOLS)
    assert r.content == "<tool_call>oops" and [c.name for c in r.tool_calls] == ["g"]
    assert parse_text(good, thinking=False, tools=None).content == good  # no tools: plain text


@pytest.mark.parametrize(
    ("raw", "schema", "expected"),
    [
        ("2", {"type": "integer"}, 2),
        ("2.0", {"type": "integer"}, 2),
        ("2.5", {"type": "integer"}, "2.5"),
        ("1e3", {"type": "number"}, 1000.0),
        ("NaN", {"type": "number"}, "NaN"),
        ("True", {"type": "boolean"}, True),
        ("false", {"type": "boolean"}, False),
        ("yes", {"type": "boolean"}, "yes"),
        ('[1, "a"]', {"type": "array"}, [1, "a"]),
        ("{'a': 1}", {"type": "object"}, "{'a': 1}"),
        ('{"a": null}', {"type": "object"}, {"a": None}),
        ("123", {"type": "string"}, "123"),
        ("null", {"type": ["string", "null"]}, None),
        ("7", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, 7),
        ("x7", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "x7"),
        ("3", {"enum": [1, 2, 3]}, 3),
        ("3", None, "3"),
        (" 4 ", {"type": "integer"}, 4),
    ],
)
def test_type_value(raw: str, schema: dict[str, Any] | None, expected: Any) -> None:
    got = type_value(raw, schema)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_token_ids_and_reasoning_token_count(chunk: int) -> None:
    tok = ours()
    output = "Let me think… 日本 🎉\n</think>\n\nAnswer: <tool_call>\n<function=g>\n<parameter=q>\nx\n</parameter>\n</function>\n</tool_call>"
    ids = tok.encode(output)
    end = ids.index(tok.token_to_id("</think>"))
    parser = OutputParser(
        thinking=True, tools=TOOLS, detokenizer=IncrementalDetokenizer(tok), call_id=counter_ids()
    )
    events: list[Event] = []
    for i in range(0, len(ids), chunk):
        events += parser.feed_ids(ids[i : i + chunk])
    events += parser.finish()
    expected = parse_text(output, thinking=True, tools=TOOLS)
    expected.tool_calls = [ToolCall("call_0", "g", {"q": "x"})]
    expected.reasoning_tokens = end + 1
    assert parser.result == expected
    check_consistent(events, parser.result)
    check_starts(output, events)
