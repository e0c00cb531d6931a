"""Paths that need exact control of the output tokens, on the scripted engine (`fake_engine.py`):
a reasoning/answer split, a tool call, a stop token, and stop strings that end inside a token.
The demo model's random weights cannot be steered to emit these, so the token ids are scripted;
the text, stop handling, parsing, protocols and log are the real code paths."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest
from conftest import API_KEY, MODEL, Server
from fake_engine import REPLY
from tokenizers import Tokenizer

from ninfer.artifact import open_artifact
from ninfer.artifact.demo import demo_path

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "request-log.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
CHAT = [{"role": "user", "content": "hi"}]
ANSWER = REPLY.split("</think>\n\n", 1)[1]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}


@pytest.fixture(scope="module")
def tok(demo_cache: Path) -> Tokenizer:
    return Tokenizer.from_file(str(open_artifact(demo_path(demo_cache)).tokenizer_path))


def oa(server: Server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, _strict_response_validation=True
    )


def an(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url, api_key=API_KEY, max_retries=0, _strict_response_validation=True
    )


def ids_until(tok: Tokenizer, text: str, needle: str) -> int:
    """How many ids of `text` are needed until their decoded text contains `needle`."""
    ids = tok.encode(text, add_special_tokens=False).ids
    for n in range(1, len(ids) + 1):
        if needle in tok.decode(ids[:n], skip_special_tokens=False):
            return n
    raise AssertionError(f"{needle!r} not in {text!r}")


def test_reasoning_split_and_stop_token(scripted_server: Server, tok: Tokenizer) -> None:
    client = oa(scripted_server)
    out = client.chat.completions.create(model=MODEL, messages=CHAT)
    msg = out.choices[0].message
    assert (msg.model_extra["reasoning_content"], msg.content) == ("Let me think.", ANSWER)
    assert out.choices[0].finish_reason == "stop"
    n = len(tok.encode(REPLY, add_special_tokens=False).ids)
    assert out.usage.completion_tokens == n + 1  # the <|im_end|> that ended the turn counts
    # ids accepted in the reasoning channel, the </think> id included
    assert out.usage.completion_tokens_details.reasoning_tokens == ids_until(tok, REPLY, "</think>")
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=CHAT, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
    )
    assert (reasoning, text) == ("Let me think.", ANSWER)
    assert chunks[-1].usage.completion_tokens == n + 1
    message = an(scripted_server).messages.create(model="m", max_tokens=64, messages=CHAT)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert (message.content[0].thinking, message.content[1].text) == ("Let me think.", ANSWER)
    assert message.stop_reason == "end_turn" and message.usage.output_tokens == n + 1


@pytest.mark.parametrize("stop", ["m th", "o", "d engine"])
def test_stop_string_ending_inside_a_token(scripted_server: Server, tok: Tokenizer, stop: str) -> None:
    shown = ANSWER[: ANSWER.index(stop)]
    used = ids_until(tok, ANSWER, stop)
    body = {"model": MODEL, "messages": CHAT, "stop": [stop, "zzz"], "extra_body": {"enable_thinking": False}}
    out = oa(scripted_server).chat.completions.create(**body)
    assert out.choices[0].message.content == (shown or None)
    assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == used
    chunks = list(oa(scripted_server).chat.completions.create(**body, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == shown
    with an(scripted_server).messages.stream(
        model="m", max_tokens=64, messages=CHAT, stop_sequences=[stop], thinking={"type": "disabled"}
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == shown and (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    assert final.usage.output_tokens == used


def test_held_stop_prefix_is_released_at_the_end(scripted_server: Server) -> None:
    """The answer ends with a proper prefix of a stop string: held back, then shown at the stop token."""
    stop = ANSWER[-7:] + "!"
    out = oa(scripted_server).chat.completions.create(
        model=MODEL, messages=CHAT, stop=stop, extra_body={"enable_thinking": False}
    )
    assert out.choices[0].message.content == ANSWER and out.choices[0].finish_reason == "stop"
    short = oa(scripted_server).chat.completions.create(
        model=MODEL, messages=CHAT, stop=stop, max_tokens=3, extra_body={"enable_thinking": False}
    )
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3


def test_tool_calls(scripted_server: Server) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    weather = [{"role": "user", "content": "weather?"}]
    out = oa(scripted_server).chat.completions.create(model=MODEL, messages=weather, tools=tools)
    call = out.choices[0].message.tool_calls[0]
    assert out.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(
        oa(scripted_server).chat.completions.create(model=MODEL, messages=weather, tools=tools, stream=True)
    )
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    called = an(scripted_server).messages.create(
        model="m",
        max_tokens=64,
        messages=weather,
        tools=[{"name": "get_weather", "input_schema": WEATHER}],
    )
    assert called.stop_reason == "tool_use" and called.content[-1].input == {"city": "Paris"}


def test_scripted_request_log(scripted_server: Server) -> None:
    time.sleep(0.3)
    events = scripted_server.events()
    for event in events:
        VALIDATOR.validate(event)
    done = [e for e in events if e["event"] == "request_done"]
    assert {e["finish_reason"] for e in done} >= {"stop", "length", "tool_calls"}
    assert all(e["reasoning_tokens"] is not None for e in done)
