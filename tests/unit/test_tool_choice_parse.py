"""Chat and Anthropic Messages tool control parsing: tool_choice spellings -> the answer's
constraint, strict tools, parallel calls off, output formats, and the 400s (param named)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ninfer.api.chat import request as chat_request
from ninfer.api.context import ApiContext
from ninfer.api.errors import ApiError
from ninfer.api.events import GenerationJob
from ninfer.api.messages import request as messages_request

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [CHAT_TOOL]}
CLOCK_TOOL = {"type": "function", "function": {"name": "get_time"}}
PATCH_TOOL = {
    "type": "custom",
    "custom": {
        "name": "patch",
        "description": "Apply a patch",
        "format": {"type": "grammar", "grammar": {"syntax": "regex", "definition": "[a-z]{1,4}"}},
    },
}
NOTE_TOOL = {"type": "custom", "custom": {"name": "note"}}
MSG_TOOL = {"name": "get_weather", "input_schema": SCHEMA}
MESSAGES: dict[str, Any] = {
    "model": "m",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [MSG_TOOL],
}


def allowed_choice(names: list[str], mode: str = "required") -> dict[str, Any]:
    """A Chat `allowed_tools` tool_choice over function tools `names`."""
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}}


def chat(**patch: Any) -> GenerationJob:
    return chat_request.parse({**CHAT, **patch}, ApiContext()).job


def messages(**patch: Any) -> GenerationJob:
    return messages_request.parse({**MESSAGES, **patch}, ApiContext()).job


def _format(job: GenerationJob) -> dict[str, Any]:
    assert job.constraint is not None and job.constraint.kind == "structural_tag"
    return json.loads(job.constraint.source)["format"]


def _calls(fmt: dict[str, Any]) -> dict[str, Any]:
    """The forced-calls part of a structural tag (after the optional lead)."""
    assert fmt["type"] == "sequence"
    return fmt["elements"][1]


def test_auto_and_none_keep_todays_behaviour() -> None:
    for job in (chat(), chat(tool_choice="auto"), messages(), messages(tool_choice={"type": "auto"})):
        assert job.constraint is None and [t.name for t in job.conversation.tools] == ["get_weather"]
    for job in (chat(tool_choice="none"), messages(tool_choice={"type": "none"})):
        assert job.constraint is None and job.conversation.tools == []


@pytest.mark.parametrize("job", [chat(tool_choice="required"), messages(tool_choice={"type": "any"})])
def test_required_forces_one_or_more_calls(job: GenerationJob) -> None:
    calls = _calls(_format(job))
    assert calls["type"] == "tags_with_separator" and calls["at_least_one"] and not calls["stop_after_first"]
    assert [t["begin"] for t in calls["tags"]] == ["<tool_call>\n<function=get_weather>\n"]
    assert calls["tags"][0]["content"]["json_schema"] == SCHEMA  # forced calls follow the schema


@pytest.mark.parametrize(
    "job",
    [
        chat(tool_choice="required", parallel_tool_calls=False),
        messages(tool_choice={"type": "any", "disable_parallel_tool_use": True}),
    ],
)
def test_parallel_off_forces_exactly_one(job: GenerationJob) -> None:
    assert _calls(_format(job))["stop_after_first"]


@pytest.mark.parametrize(
    "job",
    [
        chat(tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        messages(tool_choice={"type": "tool", "name": "get_weather"}),
    ],
)
def test_named_forces_that_tool(job: GenerationJob) -> None:
    calls = _calls(_format(job))
    assert calls["stop_after_first"] and [t["begin"] for t in calls["tags"]] == [
        "<tool_call>\n<function=get_weather>\n"
    ]


@pytest.mark.parametrize(
    "job",
    [
        chat(tools=[{**CHAT_TOOL, "function": {**CHAT_TOOL["function"], "strict": True}}]),
        messages(tools=[{**MSG_TOOL, "strict": True}]),
    ],
)
def test_strict_tools_constrain_their_arguments_under_auto(job: GenerationJob) -> None:
    fmt = _format(job)
    assert fmt["type"] == "triggered_tags" and fmt["triggers"] == ["<tool_call>"]
    assert fmt["tags"][0]["content"]["json_schema"] == SCHEMA
    assert job.conversation.tools[0].strict


def test_parallel_off_under_auto_allows_at_most_one_unconstrained_call() -> None:
    for job in (
        chat(parallel_tool_calls=False),
        messages(tool_choice={"type": "auto", "disable_parallel_tool_use": True}),
    ):
        fmt = _format(job)
        assert fmt["stop_after_first"] and fmt["tags"][0]["content"]["json_schema"] is True


def test_text_formats_combine_with_tools() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    job = chat(response_format=fmt)
    tag = _format(job)
    assert tag["type"] == "or" and tag["elements"][0]["json_schema"] == {"type": "object"}
    assert [p.param for p in job.constraint_parts] == ["response_format.json_schema.schema"]
    job = chat(response_format=fmt, tool_choice="required")
    assert _calls(_format(job))["at_least_one"]  # the answer is calls; the format waits for a text turn
    job = messages(tools=[], output_config={"format": {"type": "json_schema", "schema": SCHEMA}})
    assert job.constraint is not None and job.constraint.kind == "json_schema"
    assert (
        json.loads(job.constraint.source) == SCHEMA and job.constraint.param == "output_config.format.schema"
    )


def test_allowed_tools_restrict_the_calls_not_the_prompt() -> None:
    tools = [CHAT_TOOL, CLOCK_TOOL, PATCH_TOOL]
    job = chat(tools=tools, **allowed_choice(["get_time", "patch"]))
    assert [t.name for t in job.conversation.tools] == ["get_weather", "get_time", "patch"]  # all declared
    calls = _calls(_format(job))
    assert calls["at_least_one"] and [t["begin"] for t in calls["tags"]] == [
        "<tool_call>\n<function=get_time>\n",
        "<tool_call>\n<function=patch>\n<parameter=input>\n",
    ]
    fmt = _format(chat(tools=tools, **allowed_choice(["get_time"], "auto")))
    assert fmt["type"] == "triggered_tags" and [t["begin"] for t in fmt["tags"]] == [
        "<tool_call>\n<function=get_time>\n"
    ]
    custom = {"type": "custom", "custom": {"name": "note"}}
    mixed = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [custom]}}
    assert [t["begin"] for t in _format(chat(tools=[CHAT_TOOL, NOTE_TOOL], tool_choice=mixed))["tags"]] == [
        "<tool_call>\n<function=note>\n<parameter=input>\n"
    ]
    # every declared tool allowed under auto: nothing to enforce
    assert (
        chat(tools=[CHAT_TOOL, CLOCK_TOOL], **allowed_choice(["get_time", "get_weather"], "auto")).constraint
        is None
    )


def test_custom_tools_take_free_form_input() -> None:
    job = chat(tools=[CHAT_TOOL, PATCH_TOOL, NOTE_TOOL])
    patch, note = job.conversation.tools[1:]
    assert patch.custom and patch.grammar is not None and patch.grammar.definition == "[a-z]{1,4}"
    assert patch.parameters is not None and patch.parameters["required"] == ["input"]
    assert "[a-z]{1,4}" in patch.parameters["properties"]["input"]["description"]  # the model sees it
    assert note.custom and note.grammar is None
    fmt = _format(job)  # auto: the grammar enforces the regex of a patch call
    assert fmt["type"] == "triggered_tags"
    assert fmt["tags"][1]["content"] == {"type": "regex", "pattern": "[a-z]{1,4}"}
    assert fmt["tags"][2]["content"]["type"] == "any_text"
    assert [p.param for p in job.constraint_parts] == ["tools[1].custom.format.grammar.definition"]
    assert chat(tools=[CHAT_TOOL, NOTE_TOOL]).constraint is None  # free text: nothing to enforce
    named = chat(tools=[CHAT_TOOL, PATCH_TOOL], tool_choice={"type": "custom", "custom": {"name": "patch"}})
    assert [t["begin"] for t in _calls(_format(named))["tags"]] == [
        "<tool_call>\n<function=patch>\n<parameter=input>\n"
    ]
    history = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "type": "custom", "custom": {"name": "note", "input": "x y"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    call = chat(tools=[NOTE_TOOL], messages=history).conversation.messages[1].tool_calls[0]
    assert call.custom and call.arguments == {"input": "x y"} and call.input == "x y"


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required", "tools": []}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": {"type": "custom", "custom": {"name": "x"}}}, "tool_choice"),
        ({"tool_choice": {"type": "mcp"}}, "tool_choice.type"),
        (allowed_choice(["get_weather", "nope"]), "tool_choice.allowed_tools.tools[1].function.name"),
        (allowed_choice([]), "tool_choice.allowed_tools.tools"),
        (allowed_choice(["get_weather"], "sometimes"), "tool_choice.allowed_tools.mode"),
        (
            {"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto"}}},
            "tool_choice.allowed_tools.tools",
        ),
        (
            {
                "tool_choice": {
                    "type": "allowed_tools",
                    "allowed_tools": {"mode": "auto", "tools": [{"type": "mcp"}]},
                }
            },
            "tool_choice.allowed_tools.tools[0].type",
        ),
        (
            {
                "tools": [
                    {
                        "type": "custom",
                        "custom": {
                            "name": "c",
                            "format": {"type": "grammar", "grammar": {"syntax": "ebnf", "definition": "x"}},
                        },
                    }
                ]
            },
            "tools[0].custom.format.grammar.syntax",
        ),
        (
            {"tools": [{"type": "custom", "custom": {"name": "c", "format": {"type": "grammar"}}}]},
            "tools[0].custom.format.grammar",
        ),
        (
            {"tools": [{"type": "custom", "custom": {"name": "c", "format": {"type": "json"}}}]},
            "tools[0].custom.format.type",
        ),
        ({"tools": [{"type": "custom", "custom": {"name": "c", "strict": True}}]}, "tools[0].custom.strict"),
        ({"tools": [{"type": "custom", "custom": {}}]}, "tools[0].custom.name"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "c"}}],
                    }
                ]
            },
            "messages[0].tool_calls[0].custom.input",
        ),
        ({"tool_choice": {"type": "function"}}, "tool_choice.function"),
        ({"tool_choice": {"type": "function", "function": {}}}, "tool_choice.function.name"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
        (
            {"tools": [{**CHAT_TOOL, "function": {**CHAT_TOOL["function"], "strict": "yes"}}]},
            "tools[0].function.strict",
        ),
    ],
)
def test_chat_errors_name_the_field(patch: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as exc:
        chat(**patch)
    assert exc.value.status == 400 and exc.value.param == param, exc.value.message


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": {"type": "any"}, "tools": []}, "tool_choice"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"tool_choice": {"type": "any", "extra": 1}}, "tool_choice.extra"),
        (
            {"tool_choice": {"type": "any", "disable_parallel_tool_use": "y"}},
            "tool_choice.disable_parallel_tool_use",
        ),
        ({"tools": [{**MSG_TOOL, "strict": 1}]}, "tools[0].strict"),
        ({"output_config": {"format": {"type": "yaml"}}}, "output_config.format.type"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {}, "x": 1}}},
            "output_config.format.x",
        ),
    ],
)
def test_messages_errors_name_the_field(patch: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as exc:
        messages(**patch)
    assert exc.value.status == 400 and exc.value.param == param, exc.value.message
    assert exc.value.body("anthropic")["error"]["type"] == "invalid_request_error"


def test_an_engine_that_cannot_constrain_drops_only_a_compat_auto_constraint() -> None:
    from ninfer.api.pipeline import Pipeline

    class NoGrammars:  # an engine without a tokenizer: compiles nothing
        def check_constraint(self, spec: Any) -> None:
            from ninfer.engine.grammar import GrammarUnavailable

            raise GrammarUnavailable(spec.param, "needs an engine with a tokenizer")

    pipeline = Pipeline(NoGrammars(), None, None, lambda: 1)  # type: ignore[arg-type]
    strict = [{**MSG_TOOL, "strict": True}]
    job = messages_request.parse({**MESSAGES, "tools": strict}, ApiContext(client_compat=True)).job
    assert job.constraint is not None and job.constraint_fallback
    kept = pipeline._check_constraint(job)
    assert (
        kept.constraint is None
        and kept.compat[-1]["action"] == "mapped"
        and kept.compat[-1]["param"] == "tools"
    )
    with pytest.raises(ApiError) as exc:  # the strict contract refuses instead
        pipeline._check_constraint(messages(tools=strict))
    assert exc.value.status == 400 and exc.value.param == "tools"
    compat = ApiContext(client_compat=True)
    custom = chat_request.parse({**CHAT, "tools": [CHAT_TOOL, PATCH_TOOL]}, compat).job
    assert custom.constraint is not None and "custom tool input grammars" in (
        custom.constraint_fallback or ""
    )
    restricted = {**CHAT, "tools": [CHAT_TOOL, CLOCK_TOOL], **allowed_choice(["get_time"], "auto")}
    job = chat_request.parse(restricted, compat).job
    assert job.constraint is not None and job.constraint_fallback is None  # a restriction is never dropped
    with pytest.raises(ApiError):  # forced calls are never dropped, compat or not
        forced = {**MESSAGES, "tool_choice": {"type": "any"}}
        pipeline._check_constraint(messages_request.parse(forced, ApiContext(client_compat=True)).job)


def test_chat_shapes_custom_calls_whole_and_streamed() -> None:
    from openai.types.chat import ChatCompletion

    from ninfer.api.chat.routes import ChunkStream, _frames, completion_body
    from ninfer.api.events import Finished, ToolCallArgumentsDelta, ToolCallEnd, ToolCallStart, Usage
    from ninfer.frontend.conversation import ToolCall

    custom = ToolCall("call_1", "patch", {"input": "ab"}, custom=True)
    function = ToolCall("call_2", "get_weather", {"city": "Nice"})
    done = Finished("tool_calls", Usage(5, 3, 0, 0), "", "", (custom, function))
    body = ChatCompletion.model_validate(completion_body("c", 0, "m", done))
    first, second = body.choices[0].message.tool_calls or []
    assert first.type == "custom" and (first.id, first.custom.name, first.custom.input) == (
        "call_1",
        "patch",
        "ab",
    )
    assert second.type == "function" and json.loads(second.function.arguments) == {"city": "Nice"}

    class Gen:  # the generation's events, as the pipeline yields them
        prompt_logprobs = None  # no prompt scoring asked

        def events(self) -> list[Any]:
            return [
                ToolCallStart(0, "call_1", "patch", custom=True),
                ToolCallArgumentsDelta(0, "ab"),
                ToolCallEnd(0, custom),
                ToolCallStart(1, "call_2", "get_weather"),
                ToolCallArgumentsDelta(1, '{"city": "Nice"}'),
                ToolCallEnd(1, function),
                done,
            ]

    frames = [json.loads(f.decode()[6:]) for f in _frames(Gen(), ChunkStream("c", 0, "m", False))]  # type: ignore[arg-type]
    deltas = [d for f in frames for d in f["choices"][0]["delta"].get("tool_calls", [])]
    assert deltas == [
        {"index": 0, "id": "call_1", "type": "custom", "custom": {"name": "patch", "input": ""}},
        {"index": 0, "custom": {"input": "ab"}},
        {
            "index": 1,
            "id": "call_2",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        },
        {"index": 1, "function": {"arguments": '{"city": "Nice"}'}},
    ]
