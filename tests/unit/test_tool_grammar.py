"""Tool-call grammars (structural tags) against the template's exact call text: the calls the
Qwen templates render are accepted and parse back to the same arguments; undeclared names,
arguments outside the schema, text around forced calls and a second call when parallel calls
are off are refused. Also the protocol mapping of tool_choice to the answer's constraint."""

from __future__ import annotations

import json
from typing import Any

import pytest
import xgrammar as xgr

from ninfer.api.errors import ApiError
from ninfer.api.tool_control import Allowed, ToolControl, answer_constraint
from ninfer.engine.types import ConstraintSpec
from ninfer.frontend import tool_grammar
from ninfer.frontend.conversation import InputGrammar, Tool, custom_tool
from ninfer.frontend.parser import parse_text
from ninfer.frontend.render import render_template
from ninfer.frontend.toolcall import type_value
from ninfer.templates import read_template

WEATHER = Tool(
    "get_weather",
    "Weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
ITEMS = Tool(
    "tag_items",
    None,
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
            "ids": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        },
        "required": ["n", "ids"],
        "additionalProperties": False,
    },
)
FREE = Tool("free", None, None)
TOOLS = [WEATHER, ITEMS, FREE]


def _accepts(tag: dict[str, Any], text: str) -> bool:
    """Whether the structural tag's grammar accepts exactly `text` (and may end there)."""
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    grammar = compiler.compile_grammar(xgr.Grammar.from_structural_tag(json.dumps(tag)))
    matcher = xgr.GrammarMatcher(grammar, terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


def _rendered_calls(template: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The assistant answer text the template writes for `calls` (its exact call markup)."""
    tool_calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)
    ]
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": tool_calls},
    ]
    text = render_template(read_template(template), messages)
    start = text.index("<tool_call>")
    return text[start : text.rindex("</tool_call>") + len("</tool_call>")]


def _forced(mode: str = "required", single: bool = False, name: str | None = None) -> dict[str, Any]:
    return tool_grammar.answer_format(TOOLS, mode, single=single, name=name)  # type: ignore[arg-type]


CALLS = [
    ("get_weather", {"city": "Paris", "unit": "c"}),
    ("tag_items", {"n": 3, "ids": [1, 22]}),
    ("get_weather", {"city": "Nice"}),
]


@pytest.mark.parametrize("template", ["qwen3_5", "qwen3_6"])
def test_the_templates_calls_are_accepted_and_parse_back(template: str) -> None:
    for calls in (CALLS[:1], CALLS):
        text = _rendered_calls(template, calls)
        assert _accepts(_forced(), text), text
        assert _accepts(_forced(), "\n\n" + text)  # after `</think>` the template writes two newlines
        parsed = parse_text(text, thinking=False, tools=TOOLS)
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == calls and parsed.content == ""
    one = _rendered_calls(template, CALLS[:1])
    assert _accepts(_forced(single=True), one)
    assert _accepts(_forced("named", name="get_weather"), one)


LARK = """
start: "*** Begin\\n" line+ "*** End"
line: /[+-]/ /[a-z ]+/ "\\n"
"""
PATCH = custom_tool("patch", "Apply a patch", InputGrammar("lark", LARK))
CODE = custom_tool("code", None, InputGrammar("regex", "[A-Z]{3}-[0-9]{2}"))
NOTE = custom_tool("note", None, None)


@pytest.mark.parametrize("template", ["qwen3_5", "qwen3_6"])
def test_custom_calls_render_as_one_input_parameter_and_follow_their_grammar(template: str) -> None:
    tools = [WEATHER, PATCH, CODE, NOTE]
    patch = "*** Begin\n+ added line\n- gone\n*** End"
    calls = [("patch", {"input": patch}), ("code", {"input": "ABC-12"}), ("note", {"input": "two\nlines"})]
    text = _rendered_calls(template, calls)
    required = tool_grammar.answer_format(tools, "required")
    assert _accepts(required, text), text
    parsed = parse_text(text, thinking=False, tools=tools)
    assert [(c.name, c.input, c.custom) for c in parsed.tool_calls] == [
        (n, a["input"], True) for n, a in calls
    ]
    for name, bad in (("patch", "*** Begin\n* x\n*** End"), ("code", "abc-12"), ("note", "a</parameter>b")):
        wrong = _rendered_calls(template, [(name, {"input": bad})])
        assert not _accepts(required, wrong), wrong
        assert not _accepts(tool_grammar.answer_format(tools, "auto"), "Sure. " + wrong), wrong
    # allowed tools: the grammar of only some declared tools refuses calls to the others
    assert not _accepts(tool_grammar.answer_format([CODE], "required"), text)


def test_forced_calls_refuse_what_the_schema_or_choice_forbids() -> None:
    good = _rendered_calls("qwen3_6", CALLS[:1])
    assert not _accepts(_forced(), "hello")  # no call at all
    assert not _accepts(_forced(), "ok " + good)  # text before a forced call
    assert not _accepts(_forced(), good + "\nbye")  # text after it
    assert not _accepts(_forced(), good.replace("get_weather", "get_time"))  # undeclared tool
    assert not _accepts(_forced(), good.replace("\nc\n", "\nk\n"))  # enum
    assert not _accepts(_forced(), good.replace("Paris", "Parisssssssssss"))  # maxLength
    missing = _rendered_calls("qwen3_6", [("tag_items", {"n": 3})])
    assert not _accepts(_forced(), missing)  # a required parameter left out
    extra = _rendered_calls("qwen3_6", [("get_weather", {"city": "X", "zip": "1"})])
    assert not _accepts(_forced(), extra)  # additionalProperties false
    two = _rendered_calls("qwen3_6", CALLS[:2])
    assert not _accepts(_forced(single=True), two)  # parallel calls off
    assert not _accepts(_forced("named", name="get_weather"), two)
    assert not _accepts(_forced("named", name="tag_items"), good)  # a different tool than named
    assert _accepts(_forced(), _rendered_calls("qwen3_6", [("free", {"anything": [1, {"a": 2}]})]))


def test_auto_admits_text_and_constrains_strict_tools_only() -> None:
    strict = [Tool(WEATHER.name, None, WEATHER.parameters, strict=True), FREE]
    auto = tool_grammar.answer_format(strict, "auto")
    good = _rendered_calls("qwen3_6", CALLS[:1])
    assert _accepts(auto, "plain text, no call")
    assert _accepts(auto, "Let me check.\n\n" + good)
    assert not _accepts(auto, good.replace("\nc\n", "\nk\n"))  # strict: arguments follow the schema
    assert _accepts(auto, _rendered_calls("qwen3_6", [("free", {"x": 1})]))
    assert not _accepts(auto, "<tool_call>\n<function=other>\n</function>\n</tool_call>")
    single = tool_grammar.answer_format(strict, "auto", single=True)
    assert _accepts(single, good) and not _accepts(single, good + "\n" + good)


def test_auto_with_a_text_format_is_that_format_or_calls() -> None:
    fmt = tool_grammar.json_format(
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    )
    tag = tool_grammar.answer_format(TOOLS, "auto", text=fmt)
    assert _accepts(tag, '{"a": 1}')
    assert not _accepts(tag, "plain text")
    assert _accepts(tag, _rendered_calls("qwen3_6", CALLS[:1]))


def test_answer_constraint_keeps_todays_behaviour_without_tool_control() -> None:
    text = ConstraintSpec("json_object", param="response_format")
    assert answer_constraint(TOOLS, ToolControl(), None) is None
    assert answer_constraint([], ToolControl(mode="required"), None) is None
    assert answer_constraint(TOOLS, ToolControl(mode="none"), text) is text
    for control in (
        ToolControl(mode="required"),
        ToolControl(parallel=False),
        ToolControl(mode="named", name="free"),
    ):
        spec = answer_constraint(TOOLS, control, None)
        assert spec is not None and spec.kind == "structural_tag" and spec.param == "tools"
    strict = answer_constraint([Tool("s", None, None, strict=True)], ToolControl(), None)
    assert strict is not None and strict.kind == "structural_tag"


def test_forced_choice_errors_name_tool_choice() -> None:
    with pytest.raises(ApiError) as exc:
        ToolControl(mode="named", name="nope").check(TOOLS)
    assert exc.value.status == 400 and exc.value.param == "tool_choice" and "nope" in exc.value.message
    with pytest.raises(ApiError) as exc:
        ToolControl(mode="required").check([])
    assert exc.value.param == "tool_choice"
    ToolControl(mode="named", name="free").check(TOOLS)
    ToolControl(mode="auto").check([])
    allowed = ToolControl(mode="required", allowed=(Allowed("free", "p[0]"), Allowed("nope", "p[1]")))
    with pytest.raises(ApiError) as exc:
        allowed.check(TOOLS)
    assert exc.value.status == 400 and exc.value.param == "p[1]" and "nope" in exc.value.message


def test_string_values_lose_a_grammar_whitespace_only_when_their_schema_needs_it() -> None:
    code = {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}
    assert type_value(" ABC-12", code) == "ABC-12" and type_value("ABC-12\t", code) == "ABC-12"
    assert type_value(" red ", {"enum": ["red", "green"]}) == "red"
    assert type_value(" 2024-01-02", {"type": "string", "format": "date"}) == "2024-01-02"
    assert type_value(" abcd", {"type": "string", "maxLength": 4}) == "abcd"
    assert type_value(" ab", {"type": "string", "maxLength": 4}) == " ab"  # fits as it is: kept
    assert type_value(" nope", code) == " nope"  # no cut fits: the raw value stays
    maybe = {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]}
    assert type_value("abcd ", maybe) == "abcd" and type_value("null", maybe) is None
    assert type_value(" 7", {"type": ["integer", "string"], "maxLength": 1}) == 7
