"""Responses input Items: normalization, field-specific rejections and Items -> conversation."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses.response_item import ResponseItem
from pydantic import TypeAdapter

from ninfer.api.errors import ApiError
from ninfer.api.responses.items import normalize_input, to_messages
from ninfer.frontend.conversation import ImagePart, Message, TextPart, ToolCall, VideoPart

ITEM = TypeAdapter(ResponseItem)
PNG = "data:image/png;base64,iVBORw0KGgo="


def norm(raw: Any, vision: bool = False) -> list[dict[str, Any]]:
    return normalize_input(raw, vision)


def reject(raw: Any, code: str, param: str, vision: bool = False, taken: tuple[str, ...] = ()) -> None:
    with pytest.raises(ApiError) as info:
        normalize_input(raw, vision, taken)
    assert (info.value.status, info.value.code, info.value.param) == (400, code, param), info.value.message


def user(content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": content, **extra}


def test_string_input_is_one_user_message() -> None:
    [item] = norm("hello")
    assert item["id"].startswith("msg_") and len(item["id"]) > 8
    assert {k: v for k, v in item.items() if k != "id"} == {
        "type": "message", "role": "user", "status": "completed",
        "content": [{"type": "input_text", "text": "hello"}],
    }  # fmt: skip
    assert to_messages([item]) == [Message(role="user", parts=[TextPart("hello")])]


def test_normalized_items_are_sdk_input_items() -> None:
    items = norm(
        [
            {"role": "system", "content": "s"},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
            user([{"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": PNG}]),
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
            {"role": "assistant", "content": "a"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"x": 1}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        ],
        vision=True,
    )
    prefixes = [i["id"].split("_")[0] for i in items]
    assert prefixes == ["msg", "msg", "msg", "rs", "msg", "fc", "fco"]
    assert len({i["id"] for i in items}) == len(items)
    for raw in items:
        parsed = ITEM.validate_python(raw)  # the SDK's strict model for listed input Items
        assert parsed.id == raw["id"]
    assert items[2]["content"][1] == {"type": "input_image", "image_url": PNG, "detail": "auto"}
    assert items[4]["content"] == [{"type": "output_text", "text": "a", "annotations": []}]


def test_supplied_ids_are_preserved_and_duplicates_rejected() -> None:
    items = norm(
        [user("a", id="m1"), user("b"), {"type": "message", "role": "user", "content": "c", "id": "m3"}]
    )
    assert items[0]["id"] == "m1" and items[2]["id"] == "m3"
    reject([user("a", id="m1"), user("b", id="m1")], "duplicate_item_id", "input[1].id")
    reject([user("a", id="prev")], "duplicate_item_id", "input[0].id", taken=("prev",))
    reject([user("a", id="")], "invalid_value", "input[0].id")


def test_replayed_output_items_are_accepted() -> None:
    # What a client sends back when it replays a previous response's output Items verbatim.
    replay = [
        {"id": "rs_1", "type": "reasoning", "summary": [], "status": "completed", "encrypted_content": None,
         "content": [{"type": "reasoning_text", "text": "think"}]},
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed", "phase": None,
         "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}]},
        {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1", "name": "f",
         "arguments": "{}", "namespace": None},
    ]  # fmt: skip
    items = norm(replay)
    assert [i["id"] for i in items] == ["rs_1", "msg_1", "fc_1"]
    assert to_messages(items) == [
        Message(
            role="assistant",
            parts=[TextPart("hi")],
            reasoning="think",
            tool_calls=[ToolCall("call_1", "f", {})],
        )
    ]


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        ([user([{"type": "input_file", "file_id": "f"}])], "unsupported_value", "input[0].content[0].type"),
        ([user([{"type": "input_audio", "input_audio": {}}])], "unsupported_value", "input[0].content[0].type"),
        ([user([{"type": "input_image", "file_id": "file_1"}])], "unsupported_value", "input[0].content[0].file_id"),
        ([user([{"type": "input_image", "image_url": PNG, "detail": "high"}])], "unsupported_value",
         "input[0].content[0].detail"),
        ([user([{"type": "input_image", "image_url": "ftp://x/y.png"}])], "invalid_value",
         "input[0].content[0].image_url"),
        ([user([{"type": "input_image"}])], "missing_required_parameter", "input[0].content[0].image_url"),
        ([{"role": "system", "content": [{"type": "input_image", "image_url": PNG}]}], "invalid_value",
         "input[0].content[0].type"),
        ([user([{"type": "output_text", "text": "x"}])], "invalid_value", "input[0].content[0].type"),
        ([{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}], "invalid_value",
         "input[0].content[0].type"),
        ([{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}], "unsupported_value",
         "input[0].content[0].type"),
        ([{"role": "assistant", "content": [{"type": "output_text", "text": "x",
                                               "annotations": [{"type": "url_citation"}]}]}],
         "unsupported_value", "input[0].content[0].annotations"),
        ([user([{"type": "text", "text": "x"}])], "invalid_value", "input[0].content[0].type"),
        ([user(None)], "missing_required_parameter", "input[0].content"),
        ([user(3)], "invalid_type", "input[0].content"),
        ([{"role": "tool", "content": "x"}], "invalid_value", "input[0].role"),
        ([{"role": "assistant", "content": "x", "phase": "final_answer"}], "unsupported_value", "input[0].phase"),
        ([user("x", name="bob")], "unknown_parameter", "input[0].name"),
        ([user("x", status="done")], "invalid_value", "input[0].status"),
        ([{"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}], "unsupported_value",
         "input[0].summary"),
        ([{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}], "unsupported_value",
         "input[0].encrypted_content"),
        ([{"type": "reasoning", "summary": [], "content": [{"type": "summary_text", "text": "s"}]}],
         "unsupported_value", "input[0].content[0].type"),
        ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}], "invalid_value",
         "input[0].arguments"),
        ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}], "invalid_value",
         "input[0].arguments"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "missing_required_parameter",
         "input[0].call_id"),
        ([{"type": "function_call", "call_id": "c", "arguments": "{}"}], "missing_required_parameter",
         "input[0].name"),
        ([{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "x"}]}],
         "unsupported_value", "input[0].output"),
        ([{"type": "function_call_output", "output": "x"}], "missing_required_parameter", "input[0].call_id"),
        ([{"type": "function_call_output", "call_id": "c"}], "missing_required_parameter", "input[0].output"),
        ([{"type": "custom_tool_call", "call_id": "c", "name": "p"}], "missing_required_parameter",
         "input[0].input"),
        ([{"type": "custom_tool_call", "call_id": "c", "name": "p", "input": "x", "arguments": "{}"}],
         "unknown_parameter", "input[0].arguments"),
        ([{"type": "custom_tool_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "x"}]}],
         "unsupported_value", "input[0].output"),
        ([{"type": "item_reference", "id": "msg_1"}], "unsupported_value", "input[0].type"),
        ([{"type": "web_search_call", "id": "ws"}], "unsupported_value", "input[0].type"),
        ([{"type": "bogus"}], "invalid_value", "input[0].type"),
        ([{"content": "no role"}], "invalid_value", "input[0].type"),
        (["text"], "invalid_type", "input[0]"),
    ],
)  # fmt: skip
def test_item_rejections(raw: Any, code: str, param: str) -> None:
    reject(raw, code, param, vision=True)


def test_media_needs_vision() -> None:
    image = [user([{"type": "input_image", "image_url": PNG}])]
    video = [user([{"type": "input_video", "video_url": "https://example.com/v.mp4"}])]
    reject(image, "vision_disabled", "input[0].content[0]")
    reject(video, "vision_disabled", "input[0].content[0]")
    [item] = norm(video, vision=True)
    assert to_messages([item]) == [Message(role="user", parts=[VideoPart("https://example.com/v.mp4")])]
    assert to_messages(norm(image, vision=True)) == [Message(role="user", parts=[ImagePart(PNG)])]


def call(cid: str, args: str = "{}", name: str = "f") -> dict[str, Any]:
    return {"type": "function_call", "call_id": cid, "name": name, "arguments": args}


def reasoning(text: str) -> dict[str, Any]:
    return {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def test_grouping_and_reasoning_attachment() -> None:
    items = norm(
        [
            {"role": "system", "content": "sys"},
            user("q1"),
            reasoning("r1"),
            call("c1", '{"city": "Paris"}', "weather"),
            call("c2"),
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": "ok"},
            reasoning("r2"),
            {"role": "assistant", "content": "answer"},
            {"role": "developer", "content": "dev"},
            user("q2"),
            {"role": "assistant", "content": "lead-in"},
            call("c3"),
            reasoning("r3"),
            call("c4"),
            reasoning("dangling"),
            user("q3"),
        ]
    )
    assert to_messages(items, instructions="be brief") == [
        Message(role="developer", parts=[TextPart("be brief")]),
        Message(role="system", parts=[TextPart("sys")]),
        Message(role="user", parts=[TextPart("q1")]),
        Message(role="assistant", reasoning="r1",
                tool_calls=[ToolCall("c1", "weather", {"city": "Paris"}), ToolCall("c2", "f", {})]),
        Message(role="tool", parts=[TextPart("sunny")], tool_call_id="c1"),
        Message(role="tool", parts=[TextPart("ok")], tool_call_id="c2"),
        Message(role="assistant", parts=[TextPart("answer")], reasoning="r2"),
        Message(role="developer", parts=[TextPart("dev")]),
        Message(role="user", parts=[TextPart("q2")]),
        Message(role="assistant", parts=[TextPart("lead-in")], tool_calls=[ToolCall("c3", "f", {})]),
        Message(role="assistant", reasoning="r3", tool_calls=[ToolCall("c4", "f", {})]),
        Message(role="assistant", reasoning="dangling"),
        Message(role="user", parts=[TextPart("q3")]),
    ]  # fmt: skip


def test_consecutive_assistant_messages_stay_separate_turns() -> None:
    items = norm([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": [
        {"type": "output_text", "text": "b"}, {"type": "output_text", "text": "c"}]}])  # fmt: skip
    assert to_messages(items) == [
        Message(role="assistant", parts=[TextPart("a")]),
        Message(role="assistant", parts=[TextPart("b"), TextPart("c")]),
    ]


def test_arguments_keep_their_exact_json_string() -> None:
    args = '{"b": 1,  "a": "é"}'
    [item] = norm([call("c", args)])
    assert item["arguments"] == args
    assert to_messages([item])[0].tool_calls == [ToolCall("c", "f", json.loads(args))]


def test_custom_tool_calls_and_outputs_round_trip() -> None:
    raw = [
        user("patch it"),
        {"type": "custom_tool_call", "call_id": "c1", "name": "patch", "input": "*** Begin\n"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
    ]
    items = norm(raw)
    assert [i["id"][:4] for i in items[1:]] == ["ctc_", "ctco"]
    for item in items:
        ITEM.validate_python(item)
    messages = to_messages(items)
    assert messages[1].tool_calls == [ToolCall("c1", "patch", {"input": "*** Begin\n"}, custom=True)]
    assert messages[2] == Message(role="tool", parts=[TextPart("done")], tool_call_id="c1")
