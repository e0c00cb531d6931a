"""Structured output over HTTP on the real engine (demo artifact, random weights): Chat logprobs
(whole and streamed agree, greedy top-1 is the token), response_format json_schema outputs that
parse and validate with thinking on and off, and bad schemas as 400s naming the field."""

from __future__ import annotations

import json

import jsonschema
import pytest
import requests
from conftest import MODEL, Server

SCHEMAS = [
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["color", "n"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {
        "type": "object",
        "properties": {"tag": {"type": "string", "maxLength": 4}, "v": {"type": "null"}},
        "required": ["tag", "v"],
        "additionalProperties": False,
    },
]


def _chat(server: Server, **body) -> requests.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Answer in JSON."}], **body}
    return requests.post(
        f"{server.url}/v1/chat/completions", json=body, headers=server.headers(), timeout=120
    )


def _stream(server: Server, **body) -> list[dict]:
    r = _chat(server, stream=True, **body)
    assert r.status_code == 200, r.text
    frames = [line[6:] for line in r.content.decode("utf-8").splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(x) for x in frames[:-1]]


def test_logprobs_whole_and_streamed(server: Server) -> None:
    body = {"max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 3, "enable_thinking": False}
    whole = _chat(server, **body).json()
    content = whole["choices"][0]["logprobs"]["content"]
    assert 0 < len(content) <= whole["usage"]["completion_tokens"]
    for e in content:
        assert len(e["top_logprobs"]) == 3 and e["logprob"] <= 0.0
        assert e["top_logprobs"][0]["token"] == e["token"]  # greedy: the chosen token is the top one
        assert e["top_logprobs"][0]["logprob"] == pytest.approx(e["logprob"])
        assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]
    chunks = _stream(server, **body)
    streamed = [
        e for c in chunks for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content", [])
    ]
    assert [e["token"] for e in streamed] == [e["token"] for e in content]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in content], abs=1e-5)
    plain = _chat(server, max_tokens=4).json()
    assert plain["choices"][0]["logprobs"] is None


def test_top_logprobs_bounds(server: Server) -> None:
    r = _chat(server, max_tokens=2, logprobs=True, top_logprobs=21)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
    r = _chat(server, max_tokens=2, top_logprobs=2)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def _answer(server: Server, stream: bool, **body) -> tuple[str, str]:
    if not stream:
        msg = _chat(server, **body).json()["choices"][0]["message"]
        return msg["content"] or "", msg.get("reasoning_content") or ""
    chunks = _stream(server, **body)
    deltas = [ch["delta"] for c in chunks for ch in c["choices"]]
    return "".join(d.get("content") or "" for d in deltas), "".join(
        d.get("reasoning_content") or "" for d in deltas
    )


@pytest.mark.parametrize(
    ("stream", "thinking"), [(False, False), (True, True)], ids=["whole-no-think", "stream-think"]
)
def test_json_schema_outputs_validate(server: Server, thinking: bool, stream: bool) -> None:
    for i, schema in enumerate(SCHEMAS[:2]):
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
        content, reasoning = _answer(
            server, stream, max_tokens=40, seed=i, response_format=fmt, enable_thinking=thinking
        )
        jsonschema.validate(json.loads(content), schema)
        if thinking:
            assert reasoning  # the reasoning stayed free and came first


def test_invalid_schema_is_a_400_naming_the_field(server: Server) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}
    r = _chat(server, max_tokens=4, response_format=fmt)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_format.json_schema.schema"
    r = _chat(server, max_tokens=4, response_format={"type": "yaml"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.type"
