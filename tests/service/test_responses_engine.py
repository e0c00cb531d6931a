"""A previous_response_id chain on the real engine (gunicorn, demo artifact): later turns reuse the
resident prefix, streamed deltas equal the stored Items, through the strict official SDK."""

from __future__ import annotations

from typing import Any

import openai
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
