"""Responses Core over real gunicorn with the scripted engine (exact replies), through the official
OpenAI SDK with strict response validation."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import requests
from conftest import API_KEY, Server

MODEL = "ninfer-demo"
THINK, ANSWER = "Let me think.", "Hello from the scripted engine."  # the scripted engine's reply
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}


@pytest.fixture(scope="module")
def server(scripted_server: Server) -> Server:
    """Every test here needs the scripted engine's exact reply."""
    return scripted_server


def oa(server: Server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, _strict_response_validation=True
    )


def call(server: Server, method: str, path: str, body: Any = None) -> requests.Response:
    return requests.request(method, f"{server.url}{path}", headers=server.headers(), json=body, timeout=30)


def error(server: Server, method: str, path: str, body: Any = None) -> tuple[int, str, str | None]:
    r = call(server, method, path, body)
    e = r.json()["error"]
    return r.status_code, e["code"], e["param"]


def chat_usage(server: Server, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The Chat Completions adapter's usage for the same conversation (the reference counts)."""
    r = call(server, "POST", "/v1/chat/completions", {"model": MODEL, "messages": messages, **extra})
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def chat_prompt_tokens(server: Server, messages: list[dict[str, Any]], **extra: Any) -> int:
    return chat_usage(server, messages, max_tokens=1, **extra)["prompt_tokens"]


def test_create_retrieve_list_delete(server: Server) -> None:
    client = oa(server)
    created = client.responses.create(
        model=MODEL, input="hi", instructions="Answer concisely.", metadata={"k": "v"}, max_output_tokens=64
    )
    assert created.status == "completed" and created.id.startswith("resp_")
    reasoning, message = created.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert [c.text for c in reasoning.content] == [THINK]
    assert message.type == "message" and message.content[0].text == ANSWER and created.output_text == ANSWER
    assert reasoning.id.startswith("rs_") and message.id.startswith("msg_")
    assert (created.instructions, created.metadata, created.max_output_tokens) == (
        "Answer concisely.",
        {"k": "v"},
        64,
    )
    assert created.service_tier == "default" and created.parallel_tool_calls and created.tool_choice == "auto"
    usage = created.usage
    reference = chat_usage(
        server, [{"role": "developer", "content": "Answer concisely."}, {"role": "user", "content": "hi"}]
    )
    assert usage.input_tokens == reference["prompt_tokens"] and usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens == reference["completion_tokens"]
    assert (
        usage.output_tokens_details.reasoning_tokens
        == reference["completion_tokens_details"]["reasoning_tokens"]
    )
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens

    assert client.responses.retrieve(created.id).model_dump() == created.model_dump()
    assert error(server, "GET", f"/v1/responses/{created.id}?stream=true") == (
        400,
        "unsupported_value",
        "stream",
    )
    items = client.responses.input_items.list(created.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "hi")]
    raw = call(server, "GET", f"/v1/responses/{created.id}/input_items").json()
    assert raw["object"] == "list" and raw["first_id"] == raw["last_id"] == items.data[0].id
    assert raw["has_more"] is False

    r = call(server, "DELETE", f"/v1/responses/{created.id}")
    assert r.json() == {"id": created.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.retrieve(created.id)
    assert info.value.code == "response_not_found"
    assert error(server, "DELETE", f"/v1/responses/{created.id}") == (
        404,
        "response_not_found",
        "response_id",
    )
    assert error(server, "GET", f"/v1/responses/{created.id}/input_items")[:2] == (404, "response_not_found")


def test_stream_lifecycle_and_sdk_helper(server: Server) -> None:
    r = requests.post(
        f"{server.url}/v1/responses",
        headers=server.headers(),
        json={"model": MODEL, "input": "hi", "stream": True},
        stream=True,
        timeout=30,
    )
    assert r.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in r.text.split("\n\n") if f.strip()]
    assert "[DONE]" not in r.text
    events = []
    for f in frames:
        name, data = f.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.completed" and kinds.count("response.completed") == 1
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    thought = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert (thought, text) == (THINK, ANSWER)

    client = oa(server)
    with client.responses.stream(model=MODEL, input="hi") as stream:
        seen = [event.type for event in stream]
        final = stream.get_final_response()
    assert seen[0] == "response.created" and seen[-1] == "response.completed"
    assert final.output_text == ANSWER and client.responses.retrieve(final.id).output_text == ANSWER
    raw = list(client.responses.create(model=MODEL, input="hi", stream=True, store=False))
    assert raw[-1].type == "response.completed" and raw[-1].response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(raw[-1].response.id)


def test_previous_response_chain(server: Server) -> None:
    client = oa(server)
    first = client.responses.create(
        model=MODEL, input="hi", instructions="Be brief.", extra_body={"preserve_thinking": True}
    )
    second = client.responses.create(model=MODEL, input="and then?", previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.instructions is None
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": ANSWER, "reasoning_content": THINK},
        {"role": "user", "content": "and then?"},
    ]
    # The stored history comes back in full, the old instructions do not, preserve_thinking is inherited.
    assert second.usage.input_tokens == chat_prompt_tokens(server, history, preserve_thinking=True)
    assert second.usage.input_tokens > chat_prompt_tokens(server, history, preserve_thinking=False)
    branch = client.responses.create(
        model=MODEL,
        input="and then?",
        previous_response_id=first.id,
        extra_body={"chat_template_kwargs": {"preserve_thinking": False}},
    )
    assert branch.usage.input_tokens == chat_prompt_tokens(server, history, preserve_thinking=False)
    # A stateless replay of the same Items renders the same prompt.
    replay = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "hi"},
            *[i.model_dump() for i in first.output],
            {"role": "user", "content": "and then?"},
        ],
        extra_body={"preserve_thinking": True},
    )
    assert replay.usage.input_tokens == second.usage.input_tokens
    listed = client.responses.input_items.list(second.id)
    assert [i.content[0].text for i in listed.data] == ["and then?"]
    # Deleting an ancestor leaves the descendant's context usable.
    call(server, "DELETE", f"/v1/responses/{first.id}")
    third = client.responses.create(
        model=MODEL, input="more", previous_response_id=second.id, instructions="New."
    )
    longer = [*history, {"role": "assistant", "content": ANSWER, "reasoning_content": THINK}]
    expected = chat_prompt_tokens(
        server, [{"role": "developer", "content": "New."}, *longer, {"role": "user", "content": "more"}],
        preserve_thinking=True,
    )  # fmt: skip
    assert third.usage.input_tokens == expected
    for gone in (first.id, "resp_unknown"):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model=MODEL, input="x", previous_response_id=gone)
        assert (info.value.code, info.value.param) == ("previous_response_not_found", "previous_response_id")
    unstored = client.responses.create(model=MODEL, input="x", store=False)
    assert error(server, "POST", "/v1/responses", {"model": MODEL, "input": "y", "previous_response_id": unstored.id}) == (
        400, "previous_response_not_found", "previous_response_id")  # fmt: skip
    mine = second.output[1].id
    assert error(server, "POST", "/v1/responses", {
        "model": MODEL, "previous_response_id": second.id, "input": [{"id": mine, "role": "user", "content": "x"}],
    }) == (400, "duplicate_item_id", "input[0].id")  # fmt: skip


def test_function_calls(server: Server) -> None:
    client = oa(server)
    out = client.responses.create(model=MODEL, input="weather in Paris?", tools=[WEATHER])
    assert out.status == "completed" and [i.type for i in out.output] == ["function_call"]
    fc = out.output[0]
    assert fc.id.startswith("fc_") and fc.call_id.startswith("call_") and fc.id != fc.call_id
    assert (
        fc.name == "get_weather"
        and json.loads(fc.arguments) == {"city": "Paris"}
        and fc.status == "completed"
    )
    assert out.tools[0].name == "get_weather" and out.tools[0].strict is False

    events = list(client.responses.create(model=MODEL, input="weather?", tools=[WEATHER], stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and json.loads(args) == {"city": "Paris"} == json.loads(
        done.arguments
    )
    assert events[-1].response.output[0].arguments == args

    result = {"type": "function_call_output", "call_id": fc.call_id, "output": '{"temp": 21}'}
    follow = client.responses.create(
        model=MODEL, input=[result], previous_response_id=out.id, tools=[WEATHER]
    )
    listed = client.responses.input_items.list(follow.id).data
    assert [(i.type, i.call_id, i.output) for i in listed] == [
        ("function_call_output", fc.call_id, '{"temp": 21}')
    ]
    chat = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "",
         "tool_calls": [{"id": fc.call_id, "type": "function", "function": {"name": "get_weather", "arguments": fc.arguments}}]},
        {"role": "tool", "tool_call_id": fc.call_id, "content": '{"temp": 21}'},
    ]  # fmt: skip
    assert follow.usage.input_tokens == chat_prompt_tokens(server, chat, tools=[CHAT_WEATHER])
    stateless = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "weather in Paris?"}, fc.model_dump(), result],
        tools=[WEATHER],
    )
    assert stateless.usage.input_tokens == follow.usage.input_tokens

    cut = client.responses.create(model=MODEL, input="weather?", tools=[WEATHER], max_output_tokens=16)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 16 and cut.output[-1].status == "incomplete"


def test_input_items_pagination(server: Server) -> None:
    client = oa(server)
    items = [{"id": f"m{i}", "role": "user", "content": f"part {i}"} for i in range(5)]
    created = client.responses.create(model=MODEL, input=items)
    path = f"/v1/responses/{created.id}/input_items"
    page = call(server, "GET", f"{path}?order=asc&limit=2").json()
    assert [d["id"] for d in page["data"]] == ["m0", "m1"] and page["has_more"] is True
    assert (page["first_id"], page["last_id"]) == ("m0", "m1")
    page = call(server, "GET", f"{path}?order=asc&limit=2&after=m1").json()
    assert [d["id"] for d in page["data"]] == ["m2", "m3"] and page["has_more"] is True
    assert [d["id"] for d in call(server, "GET", path).json()["data"]] == ["m4", "m3", "m2", "m1", "m0"]
    every = [i.id for i in client.responses.input_items.list(created.id, limit=2, order="asc")]
    assert every == ["m0", "m1", "m2", "m3", "m4"]
    for query, param in (
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("order=up", "order"),
        ("after=zz", "after"),
    ):
        assert error(server, "GET", f"{path}?{query}") == (400, "invalid_value", param)


def test_input_tokens(server: Server) -> None:
    client = oa(server)
    counted = client.responses.input_tokens.count(model=MODEL, input="Count this prompt.")
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == chat_prompt_tokens(
        server, [{"role": "user", "content": "Count this prompt."}]
    )
    created = client.responses.create(model=MODEL, input="Count this prompt.")
    assert created.usage.input_tokens == counted.input_tokens
    assert error(server, "POST", "/v1/responses/input_tokens", {"model": MODEL, "input": "x", "tools": []}) == (
        400, "unknown_parameter", "tools")  # fmt: skip


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"model": "other", "input": "x"}, 404, "model_not_found", "model"),
        ({"model": MODEL, "input": "x", "seed": 1}, 400, "unknown_parameter", "seed"),
        ({"model": MODEL, "input": "x", "max_output_tokens": 8}, 400, "invalid_value", "max_output_tokens"),
        ({"model": MODEL, "input": "x", "background": True}, 400, "unsupported_value", "background"),
        ({"model": MODEL, "input": "x", "reasoning": {"effort": "low"}}, 400, "reasoning_effort_not_supported",
         "reasoning.effort"),
        ({"model": MODEL, "input": "x", "reasoning": {"effort": "high"}}, 400, "reasoning_effort_not_supported",
         "reasoning.effort"),
        ({"model": MODEL, "input": "x", "reasoning": {"effort": "max"}}, 400, "reasoning_effort_not_supported",
         "reasoning.effort"),
        ({"model": MODEL, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}, 400, "vision_disabled",
         "input[0].content[0]"),
        ({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}, 400, "unsupported_value",
         "tools[0].type"),
    ],
)  # fmt: skip
def test_create_errors(server: Server, body: dict[str, Any], status: int, code: str, param: str) -> None:
    assert error(server, "POST", "/v1/responses", body) == (status, code, param)


def test_effort_none_disables_thinking(server: Server) -> None:
    out = oa(server).responses.create(model=MODEL, input="hi", reasoning={"effort": "none"})
    assert [i.type for i in out.output] == ["message"] and out.output_text == ANSWER
    assert out.reasoning.effort == "none" and out.usage.output_tokens_details.reasoning_tokens == 0


def test_cancel_and_compact_fail_explicitly(server: Server) -> None:
    created = oa(server).responses.create(model=MODEL, input="hi")
    assert error(server, "POST", f"/v1/responses/{created.id}/cancel") == (
        400,
        "background_not_supported",
        None,
    )
    assert error(server, "POST", "/v1/responses/resp_nope/cancel")[:2] == (404, "response_not_found")
    body = {"model": MODEL, "input": "hi"}
    assert error(server, "POST", "/v1/responses/compact", body) == (400, "compaction_not_supported", None)
