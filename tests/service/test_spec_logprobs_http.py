"""Logprobs on a server that decodes speculatively (MTP, demo artifact): Chat, Responses and legacy
completions report one entry per generated token, the same entries (greedy) as a server without
speculation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import requests
from conftest import API_KEY, MODEL, REAL_OVERRIDES, Server, start_server, stop_server

CHAT: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about the sea."}],
    "max_tokens": 16,
    "temperature": 0,
    "logprobs": True,
    "top_logprobs": 3,
    "extra_body": {"enable_thinking": False},
}


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory: pytest.TempPathFactory, demo_cache: Path) -> Iterator[Server]:
    overrides = [*REAL_OVERRIDES, "spec.method=mtp", "spec.draft_tokens=3"]
    srv = start_server(tmp_path_factory.mktemp("spec"), overrides, demo_cache)
    yield srv
    assert stop_server(srv) == 0, srv.stderr_path.read_text()[-3000:]


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, _strict_response_validation=True
    )


def test_chat_logprobs_equal_spec_off(spec_server: Server, server: Server) -> None:
    got = _client(spec_server).chat.completions.create(**CHAT)
    want = _client(server).chat.completions.create(**CHAT)
    content = got.choices[0].logprobs.content  # type: ignore[union-attr]
    shown = got.usage.completion_tokens - (got.choices[0].finish_reason == "stop")  # type: ignore[union-attr]
    assert content and len(content) == shown
    for e in content:
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
    ref = want.choices[0].logprobs.content  # type: ignore[union-attr]
    assert [e.token for e in content] == [e.token for e in ref]
    assert [e.logprob for e in content] == pytest.approx([e.logprob for e in ref], abs=2e-4)
    for a, b in zip(content, ref, strict=True):
        assert [t.token for t in a.top_logprobs] == [t.token for t in b.top_logprobs]
    done = [e for e in spec_server.events() if e["event"] == "request_done"]
    assert done and all(e["speculative"]["backend"] == "mtp" for e in done)
    assert sum(e["speculative"]["rounds"] for e in done) > 0


def test_streamed_chat_logprobs_equal_whole(spec_server: Server) -> None:
    """Streamed through the SDK, a speculative round's several tokens arrive with one logprob
    entry each, the same entries as the whole response."""
    client = _client(spec_server)
    whole = client.chat.completions.create(**CHAT).choices[0].logprobs.content  # type: ignore[union-attr]
    streamed = [
        e
        for chunk in client.chat.completions.create(**CHAT, stream=True)
        if chunk.choices and chunk.choices[0].logprobs
        for e in chunk.choices[0].logprobs.content or []
    ]
    assert whole and [e.token for e in streamed] == [e.token for e in whole]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in whole], abs=1e-6)
    assert [[t.token for t in e.top_logprobs] for e in streamed] == [
        [t.token for t in e.top_logprobs] for e in whole
    ]


def test_responses_and_completions_logprobs(spec_server: Server) -> None:
    client = _client(spec_server)
    resp = client.responses.create(
        model=MODEL,
        input="Tell me about the sea.",
        max_output_tokens=16,
        temperature=0,
        reasoning={"effort": "none"},
        top_logprobs=2,
        include=["message.output_text.logprobs"],
    )
    [message] = [i for i in resp.output if i.type == "message"]
    lps = message.content[0].logprobs  # type: ignore[union-attr]
    assert lps and len(lps) in (resp.usage.output_tokens, resp.usage.output_tokens - 1)  # type: ignore[union-attr]
    assert all(len(e.top_logprobs) == 2 for e in lps)
    body = {
        "model": MODEL,
        "prompt": "The sky is",
        "max_tokens": 8,
        "logprobs": 2,
        "temperature": 1.2,
        "seed": 3,
    }
    r = requests.post(
        f"{spec_server.url}/v1/completions", json=body, headers=spec_server.headers(), timeout=120
    )
    assert r.status_code == 200, r.text
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"])
    assert len(lp["tokens"]) == usage["completion_tokens"] - (choice["finish_reason"] == "stop") >= 1
