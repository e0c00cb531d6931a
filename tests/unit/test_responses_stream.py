"""The Responses event sequencer against the official SDK's event models and stream accumulator."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from conftest_text import ours
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.response_usage import ResponseUsage
from pydantic import TypeAdapter

from ninfer.api.events import (
    Event,
    Finished,
    LogprobsDelta,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
    arguments_json,
)
from ninfer.api.responses.object import Envelope
from ninfer.api.responses.stream import ResponseSequencer, frame
from ninfer.frontend.conversation import Tool
from ninfer.frontend.parser import OutputParser
from ninfer.text.detok import IncrementalDetokenizer

EVENT = TypeAdapter(ResponseStreamEvent)
TERMINALS = {"response.completed", "response.incomplete", "response.failed"}
USAGE = Usage(prompt_tokens=40, completion_tokens=12, cached_tokens=17, reasoning_tokens=5)


def sequencer() -> ResponseSequencer:
    counter = itertools.count()
    return ResponseSequencer(Envelope(id="resp_1", model="m"), lambda p: f"{p}_{next(counter)}")


# A generation is a list of segments: ("reasoning", chunks), ("text", chunks), ("call", name, chunks).
text_chunks = st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=4)
arg_objects = st.dictionaries(
    st.sampled_from(["a", "b", "é"]), st.one_of(st.integers(-5, 99), st.text(max_size=4)), max_size=3
)


def _split(obj: dict[str, Any], cuts: list[int]) -> list[str]:
    """The call's JSON text cut into the pieces a stream may deliver."""
    text = arguments_json(obj)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


arg_chunks = st.builds(_split, arg_objects, st.lists(st.integers(1, 30), max_size=3))
segment = st.one_of(
    st.tuples(st.just("reasoning"), text_chunks),
    st.tuples(st.just("text"), text_chunks),
    st.tuples(st.just("call"), st.sampled_from(["f", "get_weather"]), arg_chunks),
)


def to_events(segments: list[tuple[Any, ...]], finish: str) -> list[Event]:
    events: list[Event] = []
    calls: list[ToolCall] = []
    for seg in segments:
        if seg[0] == "reasoning":
            events += [ReasoningDelta(c) for c in seg[1]]
        elif seg[0] == "text":
            events += [TextDelta(c) for c in seg[1]]
        else:
            index = len(calls)
            call = ToolCall(f"call_{index}", seg[1], json.loads("".join(seg[2])))
            calls.append(call)
            events.append(ToolCallStart(index, call.id, call.name))
            events += [ToolCallArgumentsDelta(index, c) for c in seg[2]]
            events.append(ToolCallEnd(index, call))
    reasoning = "".join(c for s in segments if s[0] == "reasoning" for c in s[1])
    content = "".join(c for s in segments if s[0] == "text" for c in s[1])
    events.append(Finished(finish, USAGE, reasoning, content, tuple(calls)))  # type: ignore[arg-type]
    return events


def expected_items(segments: list[tuple[Any, ...]]) -> list[tuple[str, str]]:
    """(type, text) per output Item: adjacent chunks of one kind merge, each call is its own Item."""
    items: list[tuple[str, str]] = []
    for seg in segments:
        if seg[0] == "call":
            items.append(("function_call", "".join(seg[2])))
            continue
        kind = "reasoning" if seg[0] == "reasoning" else "message"
        if items and items[-1][0] == kind:
            items[-1] = (kind, items[-1][1] + "".join(seg[1]))
        else:
            items.append((kind, "".join(seg[1])))
    return items


def item_text(item: dict[str, Any]) -> str:
    if item["type"] == "custom_tool_call":
        return item["input"]
    return item["arguments"] if item["type"] == "function_call" else item["content"][0]["text"]


def run(events: list[Event]) -> tuple[ResponseSequencer, list[dict[str, Any]]]:
    seq = sequencer()
    out = seq.start()
    for event in events:
        out += seq.feed(event)
    return seq, out


def check_lifecycle(out: list[dict[str, Any]]) -> None:
    """Sequence numbers, lifecycle order, stable ids/indices and deltas equal to the done Items."""
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert [e["type"] for e in out[:2]] == ["response.created", "response.in_progress"]
    assert [e["type"] in TERMINALS for e in out].count(True) == 1 and out[-1]["type"] in TERMINALS
    open_index: int | None = None
    ids: dict[int, str] = {}
    deltas: dict[int, list[str]] = {}
    for e in out[2:-1]:
        kind = e["type"]
        if kind == "response.output_item.added":
            assert open_index is None, "Items must not interleave"
            open_index = e["output_index"]
            assert open_index == len(ids)
            ids[open_index] = e["item"]["id"]
            deltas[open_index] = []
            assert e["item"]["status"] == "in_progress"
            continue
        assert e["output_index"] == open_index
        if kind != "response.output_item.done":
            assert e["item_id"] == ids[open_index]
        else:
            assert e["item"]["id"] == ids[open_index]
            assert item_text(e["item"]) == "".join(deltas[open_index])
            open_index = None
            continue
        if "content_index" in e:
            assert e["content_index"] == 0
        if kind.endswith(".delta"):
            deltas[open_index].append(e["delta"])
        elif kind in ("response.output_text.done", "response.reasoning_text.done"):
            assert e["text"] == "".join(deltas[open_index])
        elif kind == "response.function_call_arguments.done":
            assert e["arguments"] == "".join(deltas[open_index])
    assert open_index is None
    final = out[-1]["response"]["output"]
    assert [i["id"] for i in final] == [ids[k] for k in sorted(ids)]
    assert [item_text(i) for i in final] == ["".join(deltas[k]) for k in sorted(ids)]


@settings(max_examples=150, deadline=None)
@given(st.lists(segment, max_size=6), st.sampled_from(["stop", "length", "tool_calls"]))
def test_event_streams(segments: list[tuple[Any, ...]], finish: str) -> None:
    seq, out = run(to_events(segments, finish))
    check_lifecycle(out)
    for e in out:
        EVENT.validate_python(e)  # every frame is a valid SDK event
        assert frame(e).startswith(f"event: {e['type']}\ndata: ".encode())
    final = out[-1]["response"]
    assert final is seq.response
    assert [(i["type"], item_text(i)) for i in final["output"]] == expected_items(segments)
    incomplete = finish == "length"
    assert final["status"] == out[-1]["type"].removeprefix("response.")
    assert final["status"] == ("incomplete" if incomplete else "completed")
    assert final["incomplete_details"] == ({"reason": "max_output_tokens"} if incomplete else None)
    statuses = [i["status"] for i in final["output"]]
    if statuses and incomplete and final["output"][-1]["type"] != "function_call":
        assert statuses[:-1] == ["completed"] * (len(statuses) - 1) and statuses[-1] == "incomplete"
    else:
        assert statuses == ["completed"] * len(statuses)
    Response.model_validate(final)
    # The SDK's own stream accumulator rebuilds the same message text and call arguments.
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    rebuilt: dict[int, str] = {}
    for e in out:
        for handled in state.handle_event(EVENT.validate_python(e)):
            if handled.type in ("response.output_text.delta", "response.function_call_arguments.delta"):
                rebuilt[handled.output_index] = handled.snapshot
    for index, item in enumerate(final["output"]):
        if item["type"] != "reasoning":
            assert rebuilt[index] == item_text(item)


def test_reasoning_text_and_call_exact_sequence() -> None:
    events = to_events(
        [("reasoning", ["Let ", "me"]), ("text", ["Hi"]), ("call", "f", ['{"a": 1}'])], "tool_calls"
    )
    _, out = run(events)
    assert [(e["type"], e.get("output_index")) for e in out] == [
        ("response.created", None),
        ("response.in_progress", None),
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.done", 0),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.content_part.added", 1),
        ("response.output_text.delta", 1),
        ("response.output_text.done", 1),
        ("response.content_part.done", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.done", 2),
        ("response.output_item.done", 2),
        ("response.completed", None),
    ]
    final = out[-1]["response"]
    assert final["output"] == [
        {"id": "rs_0", "type": "reasoning", "summary": [], "status": "completed",
         "content": [{"type": "reasoning_text", "text": "Let me"}]},
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Hi", "annotations": [], "logprobs": []}]},
        {"id": "fc_2", "type": "function_call", "status": "completed", "call_id": "call_0", "name": "f",
         "arguments": '{"a": 1}'},
    ]  # fmt: skip
    assert out[2]["item"] == {
        "id": "rs_0",
        "type": "reasoning",
        "summary": [],
        "status": "in_progress",
        "content": [],
    }
    assert out[17]["name"] == "f"
    usage = ResponseUsage.model_validate(final["usage"])
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens) == (40, 17, 12)
    assert (usage.output_tokens_details.reasoning_tokens, usage.total_tokens) == (5, 52)


def test_created_events_carry_an_empty_in_progress_response() -> None:
    _, out = run(to_events([], "stop"))
    for e in out[:2]:
        assert e["response"]["status"] == "in_progress" and e["response"]["output"] == []
        assert e["response"]["usage"] is None
    assert out[-1]["response"]["output"] == [] and out[-1]["type"] == "response.completed"


def test_failure_closes_the_open_item_and_ends_with_failed() -> None:
    seq = sequencer()
    out = seq.start() + seq.feed(TextDelta("partial"))
    out += seq.fail("request_cancelled: the request was cancelled")
    check_lifecycle(out)
    final = out[-1]["response"]
    assert out[-1]["type"] == "response.failed" and final["status"] == "failed"
    assert final["error"] == {
        "code": "server_error",
        "message": "request_cancelled: the request was cancelled",
    }
    assert final["output"][0]["status"] == "incomplete" and item_text(final["output"][0]) == "partial"
    for e in out:
        EVENT.validate_python(e)


def test_settle_then_fail_replaces_the_terminal() -> None:
    seq = sequencer()
    out = seq.start() + seq.feed(TextDelta("x"))
    out += seq.settle(Finished("stop", USAGE, "", "x", ()))
    out += seq.fail("response_store_capacity_exceeded: too big")
    check_lifecycle(out)
    assert out[-1]["type"] == "response.failed" and out[-1]["response"]["output"][0]["status"] == "completed"


def test_arguments_must_match_what_was_streamed() -> None:
    seq = sequencer()
    seq.start()
    seq.feed(ToolCallStart(0, "call_0", "f"))
    seq.feed(ToolCallArgumentsDelta(0, "{}"))
    with pytest.raises(ValueError):
        seq.feed(ToolCallEnd(0, ToolCall("call_0", "f", {"a": 1})))


def test_custom_tool_calls_stream_their_input() -> None:
    call = ToolCall("call_0", "patch", {"input": "*** Begin\n+x\n"}, custom=True)
    events: list[Event] = [
        TextDelta("Ok"),
        ToolCallStart(0, call.id, call.name, custom=True),
        ToolCallArgumentsDelta(0, call.input),
        ToolCallEnd(0, call),
        Finished("tool_calls", USAGE, "", "Ok", (call,)),
    ]
    _, out = run(events)
    check_lifecycle(out)
    for e in out:
        EVENT.validate_python(e)
    assert [e["type"] for e in out[-5:]] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert out[-3]["input"] == call.input and out[-4]["delta"] == call.input
    final = Response.model_validate(out[-1]["response"])
    item = final.output[1]
    assert item.type == "custom_tool_call" and (item.call_id, item.name, item.input) == (
        "call_0",
        "patch",
        call.input,
    )
    assert out[-1]["response"]["output"][1]["id"].startswith("ctc_")


def _entry(tok: Any, token_id: int, position: int) -> dict[str, Any]:
    """A pipeline-shaped logprob entry whose logprob names its token's position."""

    def one(t: int, v: float) -> dict[str, Any]:
        raw = tok.token_bytes(t)
        return {"token": raw.decode("utf-8", "replace"), "logprob": v, "bytes": list(raw)}

    return {**one(token_id, -position), "top_logprobs": [one(token_id, -position), one(0, -99.0)]}


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_text_logprobs_follow_the_answer_tokens(step: int) -> None:
    """The real tokenizer, detokenizer and output parser: each output_text part lists exactly the
    tokens of its text (their bytes join to it), reasoning and tool-call tokens in none; deltas'
    logprobs join to the part's, in the SDK's event and Response shapes."""
    tok = ours()
    output = (
        "Let me think… 日本\n</think>\n\nHello 🎉 wörld <tool_call>\n<function=g>\n<parameter=q>\nx\n"
        "</parameter>\n</function>\n</tool_call>\nAfter é"
    )
    ids = tok.encode(output)
    detok = IncrementalDetokenizer(tok)
    parser = OutputParser(
        thinking=True, tools=[Tool("g", None, {"type": "object"})], call_id=lambda: "call_0"
    )
    seq = sequencer()
    out = seq.start()
    for i in range(0, len(ids), step):
        chunk = ids[i : i + step]
        out += seq.feed(LogprobsDelta(tuple(_entry(tok, t, i + k) for k, t in enumerate(chunk))))
        for event in parser.feed_text(detok.push(chunk)):
            out += seq.feed(event)
    for event in parser.feed_text(detok.flush()) + parser.finish():
        out += seq.feed(event)
    r = parser.result
    out += seq.feed(Finished("tool_calls", USAGE, r.reasoning, r.content, tuple(r.tool_calls)))
    check_lifecycle(out)
    for e in out:
        EVENT.validate_python(e)
    final = Response.model_validate(out[-1]["response"])
    texts = [(i.content[0].text, i.content[0].logprobs) for i in final.output if i.type == "message"]
    assert [t for t, _ in texts] == ["Hello 🎉 wörld", "\nAfter é"]
    positions = []
    for text, logprobs in texts:
        # the bytes join to the text (a token string alone can hold part of a character: U+FFFD)
        assert logprobs is not None and b"".join(bytes(e.bytes) for e in logprobs).decode() == text
        positions += [-int(e.logprob) for e in logprobs]
        assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == e.logprob for e in logprobs)
    assert positions == sorted(positions)  # in output order, each token once
    shown = {tok.token_bytes(ids[p]) for p in positions}
    assert not shown & {b"</think>", b"<tool_call>", b"</tool_call>", b"x"}  # no markup, no call tokens
    for index, (_, logprobs) in enumerate(texts):
        msg = [i for i, item in enumerate(final.output) if item.type == "message"][index]
        deltas = [e for e in out if e["type"] == "response.output_text.delta" and e["output_index"] == msg]
        streamed = [lp for e in deltas for lp in e["logprobs"]]
        assert [(lp["token"], lp["logprob"]) for lp in streamed] == [(e.token, e.logprob) for e in logprobs]
        assert all("bytes" not in lp for lp in streamed)  # the events' logprob shape has no bytes
        done = next(e for e in out if e["type"] == "response.output_text.done" and e["output_index"] == msg)
        assert done["logprobs"] == streamed
