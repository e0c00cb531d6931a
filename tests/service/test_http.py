"""The HTTP service end to end: real gunicorn, the official SDKs as strict clients, every error path."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest
import requests
from conftest import API_KEY, Server

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "request-log.schema.json").read_text())
MODEL = "ninfer-demo"
CHAT = [{"role": "user", "content": "hi"}]


def oa(server: Server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, _strict_response_validation=True
    )


def an(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url, api_key=API_KEY, max_retries=0, _strict_response_validation=True
    )


def post(server: Server, path: str, body: object, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(
        f"{server.url}{path}", headers={**server.headers(), **(headers or {})}, json=body, timeout=30
    )


def assert_ok_after(server: Server) -> None:
    r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 4})
    assert r.status_code == 200, r.text


def test_health_models_and_auth(server: Server) -> None:
    assert requests.get(f"{server.url}/health").json() == {"status": "ok"}
    r = requests.get(f"{server.url}/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = requests.get(f"{server.url}/v1/models", headers={"x-api-key": "wrong"})
    assert r.status_code == 401
    models = oa(server).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert oa(server).models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        oa(server).models.retrieve("other")
    pre = requests.options(
        f"{server.url}/v1/chat/completions",
        headers={"Origin": "http://x.test", "Access-Control-Request-Method": "POST"},
    )
    assert pre.status_code == 200 and pre.headers["Access-Control-Allow-Origin"] == "*"
    r = requests.get(f"{server.url}/v1/models", headers={"x-api-key": API_KEY, "Origin": "http://x.test"})
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    assert API_KEY not in server.stderr_path.read_text()


def test_openai_sdk_create_and_stream(server: Server) -> None:
    client = oa(server)
    out = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=40)
    msg = out.choices[0].message
    assert msg.content == "Hello from the scripted engine."
    assert msg.model_extra["reasoning_content"] == "Let me think."
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.prompt_tokens_details.cached_tokens == 0
    assert out.usage.completion_tokens_details.reasoning_tokens > 0
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=CHAT, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
    )
    assert (reasoning, text) == ("Let me think.", msg.content)
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == out.usage.total_tokens
    short = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
    stopped = client.chat.completions.create(
        model=MODEL, messages=CHAT, stop=["from the"], extra_body={"enable_thinking": False}
    )
    assert stopped.choices[0].message.content == "Hello "


def test_openai_tools(server: Server) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    out = oa(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "weather?"}], tools=tools
    )
    call = out.choices[0].message.tool_calls[0]
    assert out.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(
        oa(server).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "w"}], tools=tools, stream=True
        )
    )
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "Paris"}
    r = post(
        server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": CHAT, "tools": tools, "tool_choice": "required"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


def test_anthropic_sdk(server: Server) -> None:
    client = an(server)
    msg = client.messages.create(model="any-label", max_tokens=64, messages=CHAT, system="Be brief.")
    assert msg.model == "any-label" and msg.stop_reason == "end_turn"
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[1].text == "Hello from the scripted engine."
    with client.messages.stream(model="m", max_tokens=64, messages=CHAT) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == msg.content[1].text and final.usage.output_tokens == msg.usage.output_tokens
    count = client.messages.count_tokens(model="m", messages=CHAT, system="Be brief.")
    assert count.input_tokens == msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
    tools = [
        {
            "name": "get_weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    called = client.messages.create(
        model="m", max_tokens=64, messages=[{"role": "user", "content": "w"}], tools=tools
    )
    assert called.stop_reason == "tool_use" and called.content[-1].input == {"city": "Paris"}
    mid = [
        {"role": "user", "content": "a"},
        {"role": "system", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    r = post(
        server,
        "/v1/messages",
        {"model": "m", "max_tokens": 8, "messages": mid},
        headers={"x-api-key": API_KEY},
    )
    assert r.status_code == 400 and r.json()["type"] == "error"


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"model": "nope", "messages": CHAT}, 404, "model_not_found", "model"),
        ({"model": MODEL, "messages": CHAT, "temperature": "hot"}, 400, "invalid_type", "temperature"),
        ({"model": MODEL, "messages": CHAT, "seed": -1}, 400, "invalid_value", "seed"),
        ({"model": MODEL, "messages": CHAT, "bogus": 1}, 400, "unknown_parameter", "bogus"),
        (
            {"model": MODEL, "messages": CHAT, "reasoning_effort": "high"},
            400,
            "reasoning_effort_not_supported",
            "reasoning_effort",
        ),
        (
            {"model": MODEL, "messages": CHAT, "reasoning_effort": "none", "enable_thinking": True},
            400,
            "conflicting_template_option",
            None,
        ),
        (
            {
                "model": MODEL,
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
                ],
            },
            400,
            "vision_disabled",
            "messages[0].content[0]",
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x " * 600}]},
            400,
            "context_length_exceeded",
            "messages",
        ),
        (
            {
                "model": MODEL,
                "messages": CHAT,
                "preserve_thinking": True,
                "chat_template_kwargs": {"preserve_thinking": False},
            },
            400,
            "conflicting_template_option",
            "preserve_thinking",
        ),
    ],
)
def test_openai_errors(server: Server, body: dict, status: int, code: str, param: str | None) -> None:
    r = post(server, "/v1/chat/completions", body)
    err = r.json()["error"]
    assert (r.status_code, err["code"]) == (status, code), r.text
    if param is not None:
        assert err["param"] == param
    assert set(err) == {"message", "type", "param", "code"}
    if code == "context_length_exceeded":
        assert (
            "512" in err["message"] and str(len(body["messages"][0]["content"].split())) in err["message"]
        ) or "tokens" in err["message"]
    assert_ok_after(server)


def test_malformed_and_oversized_bodies(server: Server) -> None:
    h = {**server.headers(), "Content-Type": "application/json"}
    r = requests.post(f"{server.url}/v1/chat/completions", data=b"{not json", headers=h)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    big = b'{"model": "' + b"x" * (1024 * 1024 + 10) + b'"}'
    r = requests.post(f"{server.url}/v1/chat/completions", data=big, headers=h)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = requests.post(
        f"{server.url}/v1/messages",
        data=iter([big[:600_000], big[600_000:]]),
        headers={**h, "x-api-key": API_KEY},
    )
    assert r.status_code == 413 and r.json() == {
        "type": "error",
        "error": {"type": "request_too_large", "message": r.json()["error"]["message"]},
    }
    assert_ok_after(server)


def _stream_client(server: Server, disconnect: bool, results: list, i: int) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"client {i}"}], "stream": True}
    try:
        with requests.post(
            f"{server.url}/v1/chat/completions", json=body, headers=server.headers(), stream=True, timeout=30
        ) as r:
            if r.status_code != 200:
                results.append((r.status_code, r.json()["error"]["code"]))
                return
            lines = r.iter_lines()
            if disconnect:
                next(lines)
                next(lines)
                results.append((200, "disconnected"))
                return
            text = b"\n".join(lines)
            results.append(
                (200, "done" if b"[DONE]" in text and b'"error"' not in text else text.decode()[-200:])
            )
    except requests.RequestException as exc:
        results.append((0, repr(exc)))


def test_bounded_concurrency_and_disconnects(server: Server) -> None:
    n = 3 * (2 + 2)
    results: list = []
    threads = [
        threading.Thread(target=_stream_client, args=(server, i % 3 == 0, results, i)) for i in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == n
    allowed = {
        (200, "done"),
        (200, "disconnected"),
        (429, "server_overloaded"),
        (503, "request_queue_timeout"),
    }
    assert set(results) <= allowed, results
    assert any(r[0] == 200 for r in results)
    time.sleep(1.0)
    pool = [e for e in server.events() if e["event"] == "throughput"]
    assert pool and pool[-1]["scheduler"]["free_pages"] == pool[-1]["scheduler"]["total_pages"]
    assert pool[-1]["scheduler"]["live_tickets"] == 0 and pool[-1]["scheduler"]["running"] == 0


def test_disconnect_cancels(server: Server) -> None:
    before = {e["request_id"] for e in server.events() if e["event"] == "request_done"}
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"model": MODEL, "messages": CHAT, "stream": True, "max_tokens": 64}).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode() + body)
    assert b"200 OK" in sock.recv(200)
    sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done = [e for e in server.events() if e["event"] == "request_done" and e["request_id"] not in before]
        if done:
            break
        time.sleep(0.1)
    assert done and done[-1]["finish_reason"] == "cancelled"


def test_request_log_schema_and_pairing(server: Server) -> None:
    time.sleep(0.5)
    events = server.events()
    for event in events:
        jsonschema.validate(event, SCHEMA)
    assert events[0]["event"] == "server_start" and API_KEY not in json.dumps(events)
    assert len({e["server_instance_id"] for e in events}) == 1
    started = [e["request_id"] for e in events if e["event"] == "request_start"]
    ended = [e["request_id"] for e in events if e["event"] in ("request_done", "request_error")]
    rejected = [e["request_id"] for e in events if e["event"] == "request_rejected"]
    assert sorted(started) == sorted(ended)
    assert not set(rejected) & set(started)
    ids = sorted(started + rejected)
    assert ids == sorted(set(ids))
    assert any(e["event"] == "throughput" for e in events)
    assert all(
        isinstance(e["timings_seconds"]["total"], float) for e in events if e["event"] == "request_done"
    )
