"""Thinking budgets over the three protocols (the demo model, whose random reasoning never ends by
itself): Chat and Responses `thinking_budget`, Anthropic `thinking.budget_tokens`. The reasoning
uses exactly the budget (the "\n</think>" the engine writes at its end included, as usage counts
the ids of the reasoning channel), the answer follows it, and usage says so; with a grammar the
JSON answer starts after the closed reasoning."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import requests

from ninfer.text.tokenizer import Tokenizer
from tests.service.conftest import MODEL, Server

BUDGET = 5
MAX = 24
USER = [{"role": "user", "content": "Name a colour."}]


def _done(server: Server) -> list[dict[str, Any]]:
    return [e for e in server.events() if e["event"] == "request_done"]


def _post(server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    before = len(_done(server))
    r = requests.post(f"{server.url}{path}", json=body, headers=server.headers(), timeout=120)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    while len(_done(server)) == before and time.monotonic() < deadline:  # the log line follows the answer
        time.sleep(0.05)
    return r.json()


def _reasoning_logged(server: Server) -> int:
    return int(_done(server)[-1]["reasoning_tokens"])


@pytest.fixture(scope="module")
def tokens(server: Server) -> Tokenizer:
    from ninfer.artifact import open_artifact
    from ninfer.artifact.demo import ensure_demo_artifact

    return Tokenizer.from_file(open_artifact(ensure_demo_artifact()).tokenizer_path)


def test_chat_budget(server: Server, tokens: Tokenizer) -> None:
    out = _post(
        server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": USER, "max_tokens": MAX, "thinking_budget": BUDGET},
    )
    usage = out["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == BUDGET == _reasoning_logged(server)
    assert usage["completion_tokens"] == MAX  # the answer goes on to the output limit
    message = out["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"]
    # the reasoning shown is the budget's tokens (the template's newline before </think> stripped)
    assert len(tokens.encode(message["reasoning_content"])) <= BUDGET


def test_messages_budget_tokens(server: Server) -> None:
    body = {
        "model": MODEL,
        "messages": USER,
        "max_tokens": MAX,
        "thinking": {"type": "enabled", "budget_tokens": BUDGET},
    }
    out = _post(server, "/v1/messages", body)
    kinds = [b["type"] for b in out["content"]]
    assert kinds[:2] == ["thinking", "text"] and out["content"][1]["text"], out["content"]
    assert out["usage"]["output_tokens"] == MAX
    assert _reasoning_logged(server) == BUDGET


def test_responses_budget(server: Server) -> None:
    body = {"model": MODEL, "input": "Name a colour.", "max_output_tokens": MAX, "thinking_budget": BUDGET}
    out = _post(server, "/v1/responses", {**body, "store": False})
    assert [o["type"] for o in out["output"]][:2] == ["reasoning", "message"], out["output"]
    assert out["usage"]["output_tokens_details"]["reasoning_tokens"] == BUDGET == _reasoning_logged(server)
    assert out["usage"]["output_tokens"] == MAX


def test_budget_with_a_grammar(server: Server) -> None:
    schema = {"type": "object", "properties": {"c": {"enum": ["red", "blue"]}}, "required": ["c"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "colour", "schema": schema, "strict": True}}
    body = {"model": MODEL, "messages": USER, "max_tokens": MAX, "thinking_budget": 2, "response_format": fmt}
    out = _post(server, "/v1/chat/completions", body)
    assert out["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2
    assert json.loads(out["choices"][0]["message"]["content"])["c"] in ("red", "blue")


def test_budget_field_is_checked(server: Server) -> None:
    for path, body in (
        ("/v1/chat/completions", {"messages": USER, "thinking_budget": 0}),
        (
            "/v1/messages",
            {"messages": USER, "max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": "x"}},
        ),
    ):
        r = requests.post(
            f"{server.url}{path}", json={"model": MODEL, **body}, headers=server.headers(), timeout=60
        )
        assert r.status_code == 400, r.text
