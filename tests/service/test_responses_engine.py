"""A previous_response_id chain on the real engine (gunicorn, demo artifact): later turns reuse the
resident prefix, streamed deltas equal the stored Items; output_text logprobs whole, streamed and
stored; all through the strict official SDK."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from conftest import API_KEY, Server

MODEL = "ninfer-demo"


def item_text(item: Any) -> str:
    if item.type == "function_call":
        return item.arguments
    return "".join(c.text for c in item.content or [])


def test_three_turn_chain_reuses_the_prefix(server: Server) -> None:
    client = openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, _strict_response_validation=True
    )
    first = client.responses.create(model=MODEL, input="Tell me about the sea.", max_output_tokens=16)
    assert first.status in ("completed", "incomplete") and first.usage.output_tokens <= 16
    second = client.responses.create(
        model=MODEL, input="And the mountains?", previous_response_id=first.id, max_output_tokens=16
    )
    assert second.usage.input_tokens > first.usage.input_tokens
    assert 0 < second.usage.input_tokens_details.cached_tokens < second.usage.input_tokens

    events = list(
        client.responses.create(
            model=MODEL, input="Thanks.", previous_response_id=second.id, max_output_tokens=16, stream=True
        )
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert events[-1].type == f"response.{final.status}" and final.status in ("completed", "incomplete")
    assert final.usage.input_tokens > second.usage.input_tokens
    assert 0 < final.usage.input_tokens_details.cached_tokens < final.usage.input_tokens
    deltas: dict[int, str] = {}
    for e in events:
        if e.type.endswith(".delta"):
            deltas[e.output_index] = deltas.get(e.output_index, "") + e.delta
    assert [deltas.get(i, "") for i in range(len(final.output))] == [item_text(i) for i in final.output]
    assert client.responses.retrieve(final.id).model_dump() == final.model_dump()
    counted = client.responses.input_tokens.count(model=MODEL, input="Tell me about the sea.")
    assert counted.input_tokens == first.usage.input_tokens


def test_text_logprobs_whole_streamed_and_stored(server: Server) -> None:
    """top_logprobs + include through the strict SDK: the output_text part lists its tokens (their
    bytes join to the text) with the engine's logprobs (those Chat reports for the same prompt;
    greedy: the top alternative is the token) and 3 sorted alternatives each; the stream's deltas
    and done event carry the same; the stored Response returns them again."""
    client = openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, _strict_response_validation=True
    )
    body: dict[str, Any] = {
        "model": MODEL,
        "input": "Answer in JSON.",
        "max_output_tokens": 16,
        "temperature": 0,
        "reasoning": {"effort": "none"},
        "top_logprobs": 3,
        "include": ["message.output_text.logprobs"],
    }
    whole = client.responses.create(**body)
    assert whole.top_logprobs == 3
    [message] = [i for i in whole.output if i.type == "message"]
    part = message.content[0]
    assert part.type == "output_text" and part.logprobs
    lps = part.logprobs
    assert len(lps) in (whole.usage.output_tokens, whole.usage.output_tokens - 1)  # a stop token is not shown
    assert b"".join(bytes(e.bytes) for e in lps).decode("utf-8", "replace") == part.text
    for e in lps:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and e.logprob <= 0.0
        assert e.top_logprobs[0].token == e.token and tops[0] == pytest.approx(e.logprob)
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Answer in JSON."}],
        max_tokens=16,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"enable_thinking": False},
    )
    engine = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert [e.token for e in engine] == [e.token for e in lps]
    assert [e.logprob for e in lps] == pytest.approx([e.logprob for e in engine], abs=1e-5)

    events = list(client.responses.create(**body, stream=True))
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    [done] = [e for e in events if e.type == "response.output_text.done"]
    for got in (streamed, done.logprobs):
        assert [e.token for e in got] == [e.token for e in lps]
        assert [e.logprob for e in got] == pytest.approx([e.logprob for e in lps], abs=1e-5)
        assert all(len(e.top_logprobs or []) == 3 for e in got)
    final = events[-1].response
    [final_message] = [i for i in final.output if i.type == "message"]
    assert [e.token for e in final_message.content[0].logprobs or []] == [e.token for e in lps]
    assert client.responses.retrieve(final.id).model_dump() == final.model_dump()
    again = client.responses.retrieve(whole.id, include=["message.output_text.logprobs"])
    assert again.model_dump() == whole.model_dump()

    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**{**body, "top_logprobs": 21})
    assert info.value.code == "invalid_value" and info.value.param == "top_logprobs"
