"""Responses Create validation: every rule of the create-field table answers status/code/param."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.api.compat import Compat
from ninfer.api.errors import ApiError
from ninfer.api.responses.schema import parse_create, parse_input_tokens

BASE: dict[str, Any] = {"model": "m", "input": "hi"}
FN = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}


def reject(
    body: dict[str, Any], code: str, param: str | None, status: int = 400, vision: bool = False
) -> None:
    with pytest.raises(ApiError) as info:
        parse_create(body, vision)
    err = info.value
    assert (err.status, err.code, err.param) == (status, code, param), err.message


@pytest.mark.parametrize(
    ("patch", "code", "param"),
    [
        ({"seed": 1}, "unknown_parameter", "seed"),
        ({"messages": []}, "unknown_parameter", "messages"),
        ({"conversation": "conv_1"}, "unsupported_parameter", "conversation"),
        ({"prompt": {"id": "p"}}, "unsupported_parameter", "prompt"),
        ({"user": "u"}, "unsupported_parameter", "user"),
        ({"safety_identifier": "s"}, "unsupported_parameter", "safety_identifier"),
        ({"prompt_cache_key": "k"}, "unsupported_parameter", "prompt_cache_key"),
        ({"context_management": [{}]}, "unsupported_parameter", "context_management"),
        ({"max_tool_calls": 2}, "unsupported_parameter", "max_tool_calls"),
        ({"model": ""}, "invalid_value", "model"),
        ({"model": 3}, "invalid_type", "model"),
        ({"input": None}, "missing_required_parameter", "input"),
        ({"input": []}, "invalid_value", "input"),
        ({"input": 5}, "invalid_type", "input"),
        ({"max_output_tokens": 15}, "invalid_value", "max_output_tokens"),
        ({"max_output_tokens": "64"}, "invalid_type", "max_output_tokens"),
        ({"temperature": 2.5}, "invalid_value", "temperature"),
        ({"temperature": -0.1}, "invalid_value", "temperature"),
        ({"temperature": float("nan")}, "invalid_type", "temperature"),
        ({"top_p": 1.5}, "invalid_value", "top_p"),
        ({"stream": "yes"}, "invalid_type", "stream"),
        ({"store": 1}, "invalid_type", "store"),
        ({"instructions": ["x"]}, "invalid_type", "instructions"),
        ({"previous_response_id": 7}, "invalid_type", "previous_response_id"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_value", "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "invalid_value", "metadata"),
        ({"metadata": {"k": "v" * 513}}, "invalid_value", "metadata.k"),
        ({"metadata": {"k": 1}}, "invalid_type", "metadata.k"),
        ({"metadata": []}, "invalid_type", "metadata"),
        ({"text": {"verbosity": "low"}}, "unsupported_value", "text.verbosity"),
        ({"tools": [{"type": "web_search"}]}, "unsupported_value", "tools[0].type"),
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "unsupported_value", "tools[0].type"),
        ({"tools": [{"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "ebnf",
                                                               "definition": "x"}}]},
         "invalid_value", "tools[0].format.syntax"),
        ({"tools": [{"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "regex"}}]},
         "missing_required_parameter", "tools[0].format.definition"),
        ({"tools": [{"type": "custom", "name": "x", "format": {"type": "json"}}]}, "invalid_value",
         "tools[0].format.type"),
        ({"tools": [{"type": "custom", "name": "x", "parameters": {}}]}, "unknown_parameter",
         "tools[0].parameters"),
        ({"tools": [FN, {"type": "custom", "name": "get_weather"}]}, "invalid_value", "tools[1].name"),
        ({"tools": [FN], "tool_choice": {"type": "custom", "name": "nope"}}, "invalid_value", "tool_choice"),
        ({"tools": [FN], "tool_choice": {"type": "allowed_tools", "mode": "required",
                                         "tools": [{"type": "function", "name": "nope"}]}},
         "invalid_value", "tool_choice.tools[0].name"),
        ({"tools": [FN], "tool_choice": {"type": "allowed_tools", "mode": "any", "tools": [FN]}},
         "invalid_value", "tool_choice.mode"),
        ({"tools": [FN], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}},
         "invalid_value", "tool_choice.tools"),
        ({"tools": [FN], "tool_choice": {"type": "allowed_tools", "mode": "auto",
                                         "tools": [{"type": "mcp", "server_label": "x"}]}},
         "unsupported_value", "tool_choice.tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "x"}}]}, "unknown_parameter", "tools[0].function"),
        ({"tools": [{"type": "function"}]}, "missing_required_parameter", "tools[0].name"),
        ({"tools": [FN, FN]}, "invalid_value", "tools[1].name"),
        ({"tools": [{**FN, "parameters": "x"}]}, "invalid_type", "tools[0].parameters"),
        ({"tools": {}}, "invalid_type", "tools"),
        ({"tool_choice": "required"}, "invalid_value", "tool_choice"),
        ({"tool_choice": {"type": "function", "name": "get_weather"}}, "invalid_value", "tool_choice"),
        ({"tools": [FN], "tool_choice": {"type": "function", "name": "other"}}, "invalid_value", "tool_choice"),
        ({"tools": [FN], "tool_choice": {"type": "function"}}, "missing_required_parameter", "tool_choice.name"),
        ({"tools": [FN], "tool_choice": {"type": "web_search"}}, "unsupported_value", "tool_choice"),
        ({"tools": [FN], "tool_choice": 3}, "invalid_value", "tool_choice"),
        ({"text": {"format": {"type": "yaml"}}}, "invalid_request", "text.format.type"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "missing_required_parameter",
         "text.format.name"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": 1}}}, "invalid_type",
         "text.format.schema"),
        ({"text": {"format": {"type": "json_object", "schema": {}}}}, "unknown_parameter", "text.format.schema"),
        ({"parallel_tool_calls": "no"}, "invalid_type", "parallel_tool_calls"),
        ({"tool_choice": "sometimes"}, "invalid_value", "tool_choice"),
        ({"truncation": "auto"}, "unsupported_value", "truncation"),
        ({"top_logprobs": 21}, "invalid_value", "top_logprobs"),
        ({"top_logprobs": -1}, "invalid_value", "top_logprobs"),
        ({"top_logprobs": 1.5}, "invalid_type", "top_logprobs"),
        ({"include": ["file_search_call.results"]}, "unsupported_value", "include"),
        ({"include": ["message.output_text.logprobs", "code_interpreter_call.outputs"]}, "unsupported_value",
         "include"),
        ({"include": [3]}, "invalid_type", "include[0]"),
        ({"include": "message.output_text.logprobs"}, "invalid_type", "include"),
        ({"service_tier": "flex"}, "unsupported_value", "service_tier"),
        ({"service_tier": "priority"}, "unsupported_value", "service_tier"),
        ({"background": True}, "unsupported_value", "background"),
        ({"include": ["reasoning.encrypted_content"]}, "unsupported_value", "include"),
        ({"stream": True, "stream_options": {"include_obfuscation": True}}, "unsupported_value",
         "stream_options.include_obfuscation"),
        ({"stream": True, "stream_options": {"include_usage": True}}, "unknown_parameter",
         "stream_options.include_usage"),
        ({"stream_options": {"include_obfuscation": False}}, "invalid_value", "stream_options"),
        ({"reasoning": {"effort": "extreme"}}, "invalid_value", "reasoning.effort"),
        ({"reasoning": {"summary": "auto"}}, "unsupported_value", "reasoning.summary"),
        ({"reasoning": {"generate_summary": "concise"}}, "unsupported_value", "reasoning.generate_summary"),
        ({"reasoning": {"mode": "pro"}}, "unknown_parameter", "reasoning.mode"),
        ({"reasoning": "high"}, "invalid_type", "reasoning"),
        ({"chat_template_kwargs": {"enable_thinking": False}}, "unknown_parameter",
         "chat_template_kwargs.enable_thinking"),
        ({"chat_template_kwargs": {"preserve_thinking": "yes"}}, "invalid_type",
         "chat_template_kwargs.preserve_thinking"),
        ({"preserve_thinking": True, "chat_template_kwargs": {"preserve_thinking": False}},
         "conflicting_template_option", "preserve_thinking"),
        ({"preserve_thinking": 1}, "invalid_type", "preserve_thinking"),
    ],
)  # fmt: skip
def test_rejections(patch: dict[str, Any], code: str, param: str | None) -> None:
    reject({**BASE, **patch}, code, param)


def test_defaults() -> None:
    r = parse_create(dict(BASE), vision=False)
    assert r.model == "m" and r.store is True and r.stream is False
    assert r.max_output_tokens is None and r.temperature is None and r.top_p is None
    assert r.tool_choice == "auto" and r.tools == [] and r.metadata == {}
    assert r.effort is None and r.preserve_thinking is None and r.instructions is None
    assert [(i["type"], i["role"], i["content"]) for i in r.input_items] == [
        ("message", "user", [{"type": "input_text", "text": "hi"}])
    ]


def test_accepted_boundaries_and_echoes() -> None:
    r = parse_create(
        {
            **BASE,
            "max_output_tokens": 16,
            "temperature": 2,
            "top_p": 0,
            "metadata": {"k" * 64: "v" * 512, **{f"x{i}": "" for i in range(15)}},
            "text": {"format": {"type": "text"}},
            "tools": [{**FN, "strict": False, "description": "d"}],
            "tool_choice": "none",
            "parallel_tool_calls": True,
            "truncation": "disabled",
            "top_logprobs": 0,
            "service_tier": "auto",
            "background": False,
            "include": [],
            "stream": True,
            "stream_options": {"include_obfuscation": False},
            "reasoning": {"effort": "none", "summary": None},
            "chat_template_kwargs": {"preserve_thinking": True},
            "preserve_thinking": True,
            "store": False,
            "user": None,
            "instructions": "be brief",
        },
        vision=False,
    )
    assert r.max_output_tokens == 16 and r.temperature == 2.0 and r.top_p == 0.0
    assert len(r.metadata) == 16 and r.tool_choice == "none" and r.store is False and r.stream is True
    assert r.effort == "none" and r.preserve_thinking is True and r.instructions == "be brief"
    assert [(t.name, t.description, t.parameters) for t in r.tools] == [
        ("get_weather", "d", FN["parameters"])
    ]
    assert r.tool_defs == [
        {"type": "function", "name": "get_weather", "description": "d", "parameters": FN["parameters"],
         "strict": False}
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("patch", "echo", "engine"),
    [
        ({}, 0, None),
        ({"top_logprobs": 0, "include": []}, 0, None),
        ({"include": ["message.output_text.logprobs"]}, 0, 0),
        ({"top_logprobs": 3}, 3, 3),  # alternatives asked for: logprobs on without the include entry
        ({"top_logprobs": 20, "include": ["message.output_text.logprobs"]}, 20, 20),
    ],
)
def test_logprobs_switches(patch: dict[str, Any], echo: int, engine: int | None) -> None:
    r = parse_create({**BASE, **patch}, vision=False)
    assert (r.top_logprobs, r.logprobs) == (echo, engine)


def test_logprobs_include_beside_encrypted_reasoning_needs_compat() -> None:
    body = {**BASE, "include": ["reasoning.encrypted_content", "message.output_text.logprobs"]}
    reject(body, "unsupported_value", "include")
    r = parse_create(body, vision=False, compat=Compat(True))
    assert r.logprobs == 0 and [a["param"] for a in r.compat.adjustments] == ["include"]


@pytest.mark.parametrize("effort", ["none", "minimal", "low", "medium", "high", "xhigh", "max"])
def test_protocol_efforts_parse(effort: str) -> None:
    # Support is decided against the loaded template by the frontend, not by the schema.
    assert parse_create({**BASE, "reasoning": {"effort": effort}}, vision=False).effort == effort


def test_preserve_alias_spellings() -> None:
    assert parse_create({**BASE, "preserve_thinking": False}, False).preserve_thinking is False
    nested = {**BASE, "chat_template_kwargs": {"preserve_thinking": True}}
    assert parse_create(nested, False).preserve_thinking is True
    both = {**BASE, "chat_template_kwargs": {"preserve_thinking": True}, "preserve_thinking": True}
    assert parse_create(both, False).preserve_thinking is True


def test_input_tokens_accepts_exactly_model_and_input() -> None:
    model, items = parse_input_tokens({"model": "m", "input": "Count this prompt."}, vision=False)
    assert model == "m" and items[0]["content"] == [{"type": "input_text", "text": "Count this prompt."}]
    for extra in ("instructions", "tools", "previous_response_id", "max_output_tokens"):
        with pytest.raises(ApiError) as info:
            parse_input_tokens({"model": "m", "input": "x", extra: None}, vision=False)
        assert (info.value.code, info.value.param) == ("unknown_parameter", extra)
    with pytest.raises(ApiError) as info:
        parse_input_tokens({"model": "m"}, vision=False)
    assert (info.value.code, info.value.param) == ("missing_required_parameter", "input")


def test_tool_control_and_text_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    r = parse_create(
        {
            **BASE,
            "tools": [{**FN, "strict": True}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False,
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
        },
        vision=False,
    )
    assert (r.tool_control.mode, r.tool_control.name, r.tool_control.parallel) == (
        "named",
        "get_weather",
        False,
    )
    assert r.tool_choice == {"type": "function", "name": "get_weather"} and r.tools[0].strict
    assert r.tool_defs[0]["strict"] is True
    assert r.text_format is not None and r.text_format.kind == "json_schema" and r.text_format.strict
    assert r.text_format.param == "text.format.schema" and r.text_echo["name"] == "out"
    r = parse_create(
        {**BASE, "tools": [FN], "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, False
    )
    assert r.tool_control.mode == "required" and r.tool_control.parallel
    assert (
        r.text_format is not None
        and r.text_format.kind == "json_object"
        and r.text_echo == {"type": "json_object"}
    )


def test_allowed_tools_and_custom_tools() -> None:
    patch = {
        "type": "custom",
        "name": "patch",
        "description": "Apply a patch",
        "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "x"+'},
    }
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "custom", "name": "patch"}]}
    r = parse_create(
        {**BASE, "tools": [FN, patch, {"type": "custom", "name": "note"}], "tool_choice": allowed}, False
    )
    assert [t.name for t in r.tools] == ["get_weather", "patch", "note"]  # the prompt declares all three
    assert r.tools[1].custom and r.tools[1].grammar is not None and r.tools[1].grammar.syntax == "lark"
    assert r.tool_control.mode == "required"
    assert [t.name for t in r.tool_control.callable(r.tools)] == ["patch"]
    assert r.tool_choice == allowed and r.tool_defs[1] == patch
    assert r.tool_defs[2] == {
        "type": "custom",
        "name": "note",
        "description": None,
        "format": {"type": "text"},
    }
    assert r.tool_formats[1] == "tools[1].format.definition"
