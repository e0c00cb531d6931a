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
MSG_TOOL = {"name": "get_weather", "input_schema": SCHEMA}
MESSAGES: dict[str, Any] = {
    "model": "m",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [MSG_TOOL],
}


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


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required", "tools": []}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": {"type": "custom", "custom": {"name": "x"}}}, "tool_choice.type"),
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
    from ninfer.api.pipeline import Pipeline, PipelineConfig

    class NoGrammars:  # an engine without a tokenizer: compiles nothing
        def check_constraint(self, spec: Any) -> None:
            from ninfer.engine.grammar import GrammarUnavailable

            raise GrammarUnavailable(spec.param, "needs an engine with a tokenizer")

    pipeline = Pipeline(NoGrammars(), None, None, PipelineConfig(64, 16), lambda: 1)  # type: ignore[arg-type]
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
    with pytest.raises(ApiError):  # forced calls are never dropped, compat or not
        forced = {**MESSAGES, "tool_choice": {"type": "any"}}
        pipeline._check_constraint(messages_request.parse(forced, ApiContext(client_compat=True)).job)
