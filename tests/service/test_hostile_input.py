"""Hostile request bytes against the real gunicorn server (real engine, demo artifact): every one
is answered with a 400 in its protocol's error envelope, never a 5xx, an HTML page or an empty
body, and the server keeps serving afterwards. Legal extremes (temperature 1e-40, the largest
seed) get a correct answer."""

from __future__ import annotations

import json
import socket

import pytest
import requests
from conftest import API_KEY, MODEL, Server

DEEP = 100_000
CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
USER = [{"role": "user", "content": "hi"}]


def raw_post(server: Server, path: str, text: str) -> requests.Response:
    """POST `text` verbatim (json= would re-encode the escapes this file spells by hand)."""
    headers = {**server.headers(), "x-api-key": API_KEY, "Content-Type": "application/json"}
    return requests.post(f"{server.url}{path}", data=text.encode("utf-8"), headers=headers, timeout=60)


def assert_error(r: requests.Response, path: str, status: int, code: str, param: str | None = None) -> None:
    """The exact status and the protocol's envelope (OpenAI: its code; Anthropic: its type)."""
    assert r.status_code == status, r.text[:500]
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    if path.startswith("/v1/messages"):
        assert set(body) == {"type", "error"} and body["type"] == "error", body
        assert set(body["error"]) == {"type", "message"}
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
        return
    err = body["error"]
    assert set(body) == {"error"} and set(err) == {"message", "type", "param", "code"}, body
    assert (err["type"], err["code"]) == ("invalid_request_error", code), body
    if param is not None:
        assert err["param"] == param


def fill(template: str, *values: object) -> str:
    """`template` with each `@` replaced by the next value, verbatim (JSON spelled by hand)."""
    parts = template.split("@")
    assert len(parts) == len(values) + 1, template
    return "".join(part + str(value) for part, value in zip(parts[:-1], values, strict=True)) + parts[-1]


def chat(extra: str = "", messages: str = json.dumps(USER)) -> str:
    return fill('{"model": "@", "max_tokens": 1, "messages": @@}', MODEL, messages, extra)


def anthropic(extra: str = "", messages: str = json.dumps(USER)) -> str:
    return fill('{"model": "@", "max_tokens": 1, "messages": @@}', MODEL, messages, extra)


def responses(extra: str = "", input_: str = '"hi"') -> str:
    return fill('{"model": "@", "max_output_tokens": 16, "input": @@}', MODEL, input_, extra)


def deep_array(n: int = DEEP) -> str:
    return "[" * n + "]" * n


def deep_object(n: int = DEEP) -> str:
    return '{"a": ' * n + "1" + "}" * n


def chat_tool_history(arguments: str) -> str:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    history = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    return chat(messages=json.dumps(history))


DEPTH_CASES = [
    (CHAT, chat(', "stop": ' + deep_array())),
    (CHAT, chat(', "metadata": ' + deep_object())),
    (CHAT, chat(messages=deep_array())),
    (MESSAGES, anthropic(messages=deep_array())),
    (MESSAGES, anthropic(', "metadata": ' + deep_object())),
    ("/v1/messages/count_tokens", anthropic(messages=deep_object())),
    (RESPONSES, responses(input_=deep_array())),
    (RESPONSES, responses(', "metadata": ' + deep_object())),
    ("/v1/responses/input_tokens", fill('{"model": "@", "input": @}', MODEL, deep_array())),
]

# A lone surrogate, spelled as the JSON escape a client sends (this file's text holds no surrogate).
LONE = "H\\ud800i"
SURROGATE_CASES = [
    (CHAT, chat(messages=fill('[{"role": "user", "content": "@"}]', LONE))),
    (
        CHAT,
        chat(messages=fill('[{"role": "system", "content": "@"}, {"role": "user", "content": "hi"}]', LONE)),
    ),
    (CHAT, chat(fill(', "tools": [{"type": "function", "function": {"name": "@"}}]', LONE))),
    (CHAT, chat(fill(', "@": 1', LONE))),  # an unknown field's name
    (MESSAGES, anthropic(fill(', "system": "@"', LONE))),
    (MESSAGES, anthropic(fill(', "metadata": {"user_id": "@"}', LONE))),
    (MESSAGES, anthropic(fill(', "tools": [{"name": "@", "input_schema": {"type": "object"}}]', LONE))),
    (MESSAGES, anthropic(fill(', "@": 1', LONE))),
    (
        "/v1/messages/count_tokens",
        fill('{"model": "m", "messages": [{"role": "user", "content": "@"}]}', LONE),
    ),
    (RESPONSES, responses(fill(', "instructions": "@"', LONE))),
    (RESPONSES, responses(fill(', "metadata": {"k": "@"}', LONE))),
    (RESPONSES, responses(fill(', "metadata": {"@": "v"}', LONE))),
    (RESPONSES, responses(fill(', "tools": [{"type": "function", "name": "@"}]', LONE))),
    (RESPONSES, responses(fill(', "stream": true, "metadata": {"k": "@"}', LONE))),
    (RESPONSES, responses(fill(', "@": 1', LONE))),
    ("/v1/responses/input_tokens", fill('{"model": "@", "input": "@"}', MODEL, LONE)),
]


@pytest.mark.parametrize(("path", "text"), DEPTH_CASES)
def test_deep_nesting_is_a_400(server: Server, path: str, text: str) -> None:
    r = raw_post(server, path, text)
    assert_error(r, path, 400, "invalid_json")
    assert "nested deeper than" in r.text


@pytest.mark.parametrize(("path", "text"), SURROGATE_CASES)
def test_lone_surrogates_are_a_400(server: Server, path: str, text: str) -> None:
    r = raw_post(server, path, text)
    assert_error(r, path, 400, "invalid_json")
    assert "surrogate" in r.text


def test_deep_and_surrogate_tool_call_arguments(server: Server) -> None:
    param = "messages[1].tool_calls[0].function.arguments"
    for arguments in (fill('{"a": @}', deep_array()), '{"a": "\\ud800"}'):
        r = raw_post(server, CHAT, chat_tool_history(arguments))
        assert_error(r, CHAT, 400, "invalid_request", param)
    item = {
        "type": "function_call",
        "call_id": "c1",
        "name": "f",
        "arguments": fill('{"a": @}', deep_array()),
    }
    r = raw_post(server, RESPONSES, responses(input_=json.dumps([item])))
    assert_error(r, RESPONSES, 400, "invalid_value", "input[0].arguments")
    assert "nested deeper than" in r.json()["error"]["message"]
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": json.loads(deep_object(40))}
    history = [*USER, {"role": "assistant", "content": [use]}]
    ok = raw_post(server, MESSAGES, anthropic(messages=json.dumps(history)))
    assert ok.status_code in (200, 400), ok.text  # within the bound: judged by the protocol rules
    r = raw_post(
        server,
        MESSAGES,
        anthropic(messages=json.dumps(history).replace('"a": 1', fill('"a": @', deep_array()))),
    )
    assert_error(r, MESSAGES, 400, "invalid_json")


def test_non_json_numbers_are_a_400(server: Server) -> None:
    for constant in ("NaN", "Infinity", "-Infinity"):
        for path, text in (
            (CHAT, chat(', "temperature": ' + constant)),
            (MESSAGES, anthropic(', "top_p": ' + constant)),
        ):
            assert_error(raw_post(server, path, text), path, 400, "invalid_json")


def test_seed_bounds(server: Server) -> None:
    r = raw_post(server, CHAT, chat(fill(', "seed": @', 2**64)))
    assert_error(r, CHAT, 400, "invalid_value", "seed")
    r = raw_post(server, CHAT, chat(fill(', "seed": @', 10**30)))
    assert_error(r, CHAT, 400, "invalid_value", "seed")
    r = raw_post(server, CHAT, chat(fill(', "seed": @, "temperature": 1.0', 2**64 - 1)))
    assert r.status_code == 200, r.text


def test_tiny_temperature_and_zero_top_p_answer_like_greedy(server: Server) -> None:
    """1e-40 is in [0, 2] and 0 in top_p's [0, 1]: answered, with the greedy tokens (the limits
    of sampling as t -> 0 and top_p -> 0)."""
    prompt = [{"role": "user", "content": "Count: one two three"}]

    def chat_text(temperature: str) -> str:
        body = chat(
            fill(', "temperature": @, "enable_thinking": false, "seed": 7', temperature), json.dumps(prompt)
        )
        r = raw_post(server, CHAT, body.replace('"max_tokens": 1', '"max_tokens": 4'))
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    greedy = chat_text("0")
    for tiny in ("1e-40", "1e-30", "5e-324", "-0.0"):
        assert chat_text(tiny) == greedy, tiny
    assert chat_text('1.0, "top_p": 0') == greedy  # a nucleus of mass 0 is the top token alone
    r = raw_post(server, RESPONSES, responses(', "top_p": 0, "temperature": 2'))
    assert r.status_code == 200 and r.json()["object"] == "response", r.text
    r = raw_post(server, MESSAGES, anthropic(', "temperature": 1e-40'))
    assert r.status_code == 200 and r.json()["type"] == "message", r.text


def _raw_exchange(server: Server, head: bytes, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes on a socket and read the whole answer (the server closes after an error)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + body)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_part, _, payload = data.partition(b"\r\n\r\n")
    lines = head_part.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, payload


@pytest.mark.parametrize("size_line", [b"zz", b"-5", b"0x5", b"5 5"])
def test_malformed_chunk_size_is_a_400(server: Server, size_line: bytes) -> None:
    for path in (CHAT, MESSAGES):
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: {API_KEY}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        ).encode()
        status, headers, payload = _raw_exchange(server, head, size_line + b"\r\n{}\r\n0\r\n\r\n")
        assert status == 400, payload
        assert headers["content-type"].startswith("application/json")
        body = json.loads(payload[: int(headers["content-length"])])
        if path == MESSAGES:
            assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        else:
            # refused while the worker frames the request ("invalid chunk size"), or by the app
            # when a body reaches it unreadable ("the request body could not be read")
            message = body["error"]["message"]
            assert body["error"]["code"] == "invalid_request"
            assert "chunk" in message or "could not be read" in message, message


def test_server_still_serves_and_logged_no_fault(server: Server) -> None:
    r = raw_post(server, CHAT, chat())
    assert r.status_code == 200, r.text
    log = server.stderr_path.read_text()
    assert "unhandled error" not in log and "request parser" not in log, log[-3000:]
