"""Structured output and tool control over HTTP on the real engine (demo artifact, random
weights): all three protocols, whole and streamed, thinking on and off.

* Tool control: `required` always yields at least one call to a declared tool whose arguments
  validate against its schema; a named tool yields exactly that one call; parallel calls off
  yield exactly one; strict tools under `auto` are constrained; a named tool that is not
  declared is a 400 on `tool_choice`.
* Restricted and custom tools through the openai SDK: an `allowed_tools` choice with mode
  `required` (a function and a custom tool: Chat whole; the custom tool alone: Responses
  streamed) yields one call to an allowed tool, a custom tool's input fullmatching its regex
  (custom calls and their outputs in the history); an undeclared allowed name and a regex the
  compiler refuses are 400s naming their field.
* Six schemas of the corpus (`schema_corpus.CORPUS`; all of it is sampled against the real
  masks in `test_schema_property.py`) through the three protocols' text formats (Chat
  `response_format`, Responses `text.format`, Anthropic `output_config.format`), whole and
  streamed, thinking on and off: every answer ended by itself and validates with `jsonschema`.
* A schema the grammar cannot enforce (a malformed keyword value, an unsupported keyword), as a
  text format of each protocol or a strict / forced tool's parameters, is a 400 whose message
  names the schema path and keyword (and the tool), in the protocol's error shape; the server
  keeps serving.

Random weights: the mask leaves only grammar tokens and every open-ended part of the schemas is
bounded, so answers end within small budgets (the corpus needs 2 to 41 tokens a schema; a tool
call about 60). Thinking requests spend half their budget on reasoning first (random weights
never end it themselves), so few schemas use it. One server serves the module; requests go two
at a time (max_concurrency 2).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from conftest import API_KEY, MODEL, Server, start_server, stop_server
from protocol_client import PROTOCOLS, Answer, ask, body, post
from schema_corpus import CORPUS, TOOLS

SCHEMAS = dict(CORPUS)

OVERRIDES = [
    "engine.device=cpu",
    "engine.max_concurrency=2",
    "engine.max_pending_requests=4",
    "engine.max_context=2048",
    "kv.capacity=4096",
    "engine.default_max_tokens=64",
    "sampling.seed=0",
    "logging.log_stats_interval_ms=1000",
]
JSON_TOKENS = 48  # an answer's budget (the corpus needs 2 to 41 tokens a schema)
SLOW = {"obj-mixed-types": 96, "obj-formats": 96, "defs-ref": 96, "recursive-list": 128, "recursive-tree": 128,
        "recursive-expr": 128, "format-date-time": 64}  # fmt: skip
THINK_TOKENS = 32  # with thinking: as many reasoning tokens (never ended by random weights), then the answer
FINISHED = {"stop", "tool_calls", "completed", "end_turn", "tool_use"}
CHECKER = jsonschema.FormatChecker()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, demo_cache: Path) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("structured"), OVERRIDES, demo_cache)
    yield srv
    assert stop_server(srv) == 0, srv.stderr_path.read_text()[-3000:]


def _tools(protocol: str, strict: bool = False) -> list[dict[str, Any]]:
    if protocol == "chat":
        return [{"type": "function", "function": {**t, "strict": strict}} for t in TOOLS]
    if protocol == "responses":
        return [{"type": "function", **t, "strict": strict} for t in TOOLS]
    return [
        {
            "name": t["name"],
            "description": t["description"],
            "input_schema": t["parameters"],
            "strict": strict,
        }
        for t in TOOLS
    ]


def _choice(protocol: str, kind: str, name: str | None = None, parallel: bool = True) -> dict[str, Any]:
    """`tool_choice` (and the parallel switch) in `protocol`'s spelling: kind auto | required | named."""
    if protocol == "messages":
        spelled: dict[str, Any] = {"auto": {"type": "auto"}, "required": {"type": "any"}}.get(kind) or {
            "type": "tool",
            "name": name,
        }
        return {"tool_choice": {**spelled, **({} if parallel else {"disable_parallel_tool_use": True})}}
    if kind == "named":
        fn = (
            {"type": "function", "function": {"name": name}}
            if protocol == "chat"
            else {"type": "function", "name": name}
        )
        out: dict[str, Any] = {"tool_choice": fn}
    else:
        out = {"tool_choice": kind}
    return out if parallel else {**out, "parallel_tool_calls": False}


def _text_format(protocol: str, name: str, schema: dict[str, Any]) -> dict[str, Any]:
    if protocol == "chat":
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": True},
            }
        }
    if protocol == "responses":
        return {"text": {"format": {"type": "json_schema", "name": name, "schema": schema, "strict": True}}}
    return {"output_config": {"format": {"type": "json_schema", "schema": schema}}}


def _check_calls(answer: Answer, allowed: set[str]) -> None:
    """Every call names a declared (allowed) tool and its arguments validate against its schema."""
    schemas = {t["name"]: t["parameters"] for t in TOOLS}
    for name, args in answer.calls:
        assert name in allowed, (name, answer)
        jsonschema.validate(args, schemas[name], format_checker=CHECKER)
    assert answer.text.strip() == "", answer  # forced calls leave no text


# protocol, tool_choice kind, named tool, parallel calls, stream, thinking, max_tokens: each protocol
# forces both ways, whole and streamed, with thinking on and off, parallel calls on and off.
# Each protocol's forced shapes over HTTP, between them required and named, parallel on and off,
# streamed and whole, thinking on and off (the grammars themselves: test_schema_property.py
# samples forced calls of every tool against the real masks)
TOOL_CASES = [
    ("chat", "required", None, True, False, False, 192),
    ("responses", "named", "get_weather", True, False, True, 192),
    ("messages", "required", None, True, True, False, 192),
    ("messages", "named", "tag_items", False, False, False, 128),
]


def _tool_case(server: Server, case: tuple[Any, ...]) -> tuple[tuple[Any, ...], Answer]:
    protocol, kind, name, parallel, stream, thinking, budget = case
    choice = _choice(protocol, kind, name, parallel)
    payload = body(protocol, "Use a tool.", budget, thinking, stream, tools=_tools(protocol), **choice)
    return case, ask(server, protocol, payload)


def test_tool_choice_forces_valid_calls(server: Server) -> None:
    declared = {t["name"] for t in TOOLS}
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: _tool_case(server, c), TOOL_CASES))
    for (_, kind, name, parallel, _, thinking, _), answer in results:
        assert answer.finish in FINISHED, answer
        assert len(answer.calls) >= 1, answer
        _check_calls(answer, {name} if name else declared)
        if kind == "named" or not parallel:
            assert len(answer.calls) == 1, answer
        assert bool(answer.reasoning) == thinking, answer  # the reasoning stayed free and came first


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_strict_auto_and_undeclared_names(server: Server, protocol: str) -> None:
    payload = body(protocol, "Weather in Paris?", 16, False, False, tools=_tools(protocol, strict=True))
    answer = ask(server, protocol, payload)
    schemas = {t["name"]: t["parameters"] for t in TOOLS}
    for name, args in answer.calls:  # random weights mostly answer text; any call is valid
        jsonschema.validate(args, schemas[name], format_checker=CHECKER)
    named = _choice(protocol, "named", "no_such_tool")
    r = post(server, protocol, body(protocol, "x", 8, False, False, tools=_tools(protocol), **named))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if protocol == "messages":
        assert error["type"] == "invalid_request_error" and "no_such_tool" in error["message"]
    else:
        assert error["param"] == "tool_choice" and error["type"] == "invalid_request_error"


CODE_RE = "[a-c][0-9]"  # fixed length: random weights end the input where the regex does
CODE = {"name": "code", "description": "Send a code", "format": {"type": "grammar", "syntax": "regex"}}


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


def _chat_tools(regex: str = CODE_RE) -> list[dict[str, Any]]:
    fmt = {"type": "grammar", "grammar": {"syntax": "regex", "definition": regex}}
    custom = {"name": "code", "description": CODE["description"], "format": fmt}
    return [*_tools("chat")[:2], {"type": "custom", "custom": custom}]  # get_weather, add, code


def _responses_tools() -> list[dict[str, Any]]:
    custom = {"type": "custom", **CODE, "format": {**CODE["format"], "definition": CODE_RE}}
    return [*_tools("responses")[:2], custom]  # get_weather, add, code


def _check_restricted(calls: list[tuple[str, Any]], allowed: set[str]) -> None:
    """One call (parallel calls off), to an allowed tool: arguments valid, a custom input the regex."""
    schemas = {t["name"]: t["parameters"] for t in TOOLS}
    assert len(calls) == 1, calls
    for name, payload in calls:
        assert name in allowed, calls
        if name == "code":
            assert isinstance(payload, str) and re.fullmatch(CODE_RE, payload), calls
        else:
            jsonschema.validate(json.loads(payload), schemas[name], format_checker=CHECKER)


def _chat_calls(client: openai.OpenAI, **extra: Any) -> list[tuple[str, Any]]:
    """(name, arguments JSON or custom input) of each call of one Chat answer (its streamed shape:
    `tests/unit/test_tool_choice_parse.py`)."""
    kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "parallel_tool_calls": False}
    done = client.chat.completions.create(extra_body={"enable_thinking": False}, **kwargs, **extra)
    assert done.choices[0].finish_reason == "tool_calls", done
    return [
        (c.custom.name, c.custom.input) if c.type == "custom" else (c.function.name, c.function.arguments)
        for c in done.choices[0].message.tool_calls or []
    ]


def _responses_calls(client: openai.OpenAI, **extra: Any) -> list[tuple[str, Any]]:
    """(name, arguments JSON or custom input) of each call of one streamed Response, checking the
    streamed Items against the final Response."""
    kwargs: dict[str, Any] = {"model": MODEL, "max_output_tokens": 64, "parallel_tool_calls": False}
    kwargs.update(store=False, reasoning={"effort": "none"}, tools=_responses_tools(), stream=True, **extra)
    items, final = [], None
    for event in client.responses.create(**kwargs):
        if event.type == "response.output_item.done":
            items.append(event.item)
        elif event.type == "response.completed":
            final = event.response
    assert final is not None and final.output == items, final
    assert final.tool_choice.model_dump() == extra["tool_choice"] and final.tools[-1].type == "custom"
    return [
        (i.name, i.input) if i.type == "custom_tool_call" else (i.name, i.arguments)
        for i in items
        if i.type in ("custom_tool_call", "function_call")
    ]


def test_allowed_tools_and_custom_tools_through_the_sdk(server: Server) -> None:
    client = _client(server)
    messages = [{"role": "user", "content": "Use a tool."}]
    chat_allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "add"}}, {"type": "custom", "custom": {"name": "code"}}]}}  # fmt: skip
    chat_history = [
        *messages,
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "custom", "custom": {"name": "code", "input": "a1"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sent"},
        {"role": "user", "content": "Another one."},
    ]  # fmt: skip
    only_code = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "custom", "name": "code"}]}
    responses_history = [
        *messages,
        {"type": "custom_tool_call", "call_id": "c1", "name": "code", "input": "a1"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "sent"},
    ]
    cases = [  # (allowed names, the answer's calls), two at a time
        ({"add", "code"}, lambda: _chat_calls(client, messages=chat_history, tools=_chat_tools(), tool_choice=chat_allowed)),
        ({"code"}, lambda: _responses_calls(client, input=responses_history, tool_choice=only_code)),
    ]  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda case: case[1](), cases))
    for (allowed, _), calls in zip(cases, results, strict=True):
        _check_restricted(calls, allowed)
    bad_allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": "nope"}}]}}  # fmt: skip
    for patch, param in (
        (
            {"tools": _chat_tools(), "tool_choice": bad_allowed},
            "tool_choice.allowed_tools.tools[0].function.name",
        ),
        ({"tools": _chat_tools("[a-")}, "tools[2].custom.format.grammar.definition"),
    ):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, **patch)  # type: ignore[call-overload]
        assert exc.value.body["param"] == param  # type: ignore[index]


# A few schemas of the corpus end to end, two per protocol, whole and streamed, thinking on
# and off (the whole corpus is sampled against the real masks in test_schema_property.py).
CORPUS_CASES = [  # (schema name, protocol, stream, thinking)
    ("support-ticket-pydantic", "chat", False, False),
    ("format-date", "chat", True, True),
    ("recursive-root", "responses", True, False),
    ("pattern-code", "responses", False, True),
    ("anyof-in-object", "messages", False, False),
    ("array-exact", "messages", True, False),
]


def _corpus_case(server: Server, case: tuple[str, str, bool, bool]) -> tuple[str, Answer]:
    name, protocol, stream, thinking = case
    budget = 2 * THINK_TOKENS if thinking else SLOW.get(name, JSON_TOKENS)
    fmt = _text_format(protocol, name, SCHEMAS[name])
    payload = body(protocol, "Answer in JSON.", budget, thinking, stream, **fmt)
    return f"{name} ({protocol}, stream={stream}, thinking={thinking})", ask(server, protocol, payload)


def test_schema_corpus_outputs_validate(server: Server) -> None:
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: _corpus_case(server, c), CORPUS_CASES))
    failures = []
    for (label, answer), (name, _, _, thinking) in zip(results, CORPUS_CASES, strict=True):
        try:
            assert answer.finish in FINISHED, f"did not finish: {answer.finish}"
            jsonschema.validate(json.loads(answer.text), SCHEMAS[name], format_checker=CHECKER)
            assert bool(answer.reasoning) == thinking, "reasoning"
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            failures.append(f"{label}: {str(exc)[:200]} in {answer.text!r}")
    assert not failures, "\n".join(failures)


BAD = {"type": "object", "properties": {"a": {"type": "string", "maxLength": -1}}}
BAD_MESSAGE = "properties/a/maxLength: invalid schema: -1 is less than the minimum of 0"
UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
UNIQUE_MESSAGE = "uniqueItems: uniqueItems is not supported by the grammar engine"
IDS = {"type": "object", "properties": {"ids": UNIQUE}, "required": ["ids"]}
BAD_CASES = [  # (protocol, request fields, param, message)
    ("chat", _text_format("chat", "bad", BAD), "response_format.json_schema.schema", BAD_MESSAGE),
    ("responses", _text_format("responses", "u", UNIQUE), "text.format.schema", UNIQUE_MESSAGE),
    ("messages", _text_format("messages", "bad", BAD), None, BAD_MESSAGE),
    (
        "chat",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": BAD, "strict": True}}]},
        "tools",
        f"tool 'f' parameters: {BAD_MESSAGE}",
    ),
    (
        "messages",
        {"tools": [{"name": "f", "input_schema": IDS}], "tool_choice": {"type": "tool", "name": "f"}},
        None,
        f"tool 'f' parameters: properties/ids/{UNIQUE_MESSAGE}",
    ),
]


BAD_IDS = ["chat-format", "responses-format", "messages-format", "chat-strict-tool", "messages-forced-tool"]


@pytest.mark.parametrize(("protocol", "fields", "param", "message"), BAD_CASES, ids=BAD_IDS)
def test_bad_schemas_are_400s_naming_the_schema_path(
    server: Server, protocol: str, fields: dict[str, Any], param: str | None, message: str
) -> None:
    r = post(server, protocol, body(protocol, "x", 16, False, False, **fields))
    assert r.status_code == 400, r.text
    if protocol == "messages":
        assert r.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    else:
        error = r.json()["error"]
        assert (error["param"], error["message"], error["type"]) == (param, message, "invalid_request_error")
    ok = post(server, protocol, body(protocol, "x", 16, False, False))  # the server keeps serving
    assert ok.status_code == 200, ok.text
