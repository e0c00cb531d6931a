"""A previous_response_id chain on the real engine (demo artifact, CPU): later turns reuse the
resident prefix. The app runs in-process; the official SDK talks to it through httpx2's WSGI
transport with strict response validation."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest
import torch

from ninfer.api.context import ApiContext
from ninfer.api.pipeline import Pipeline, PipelineConfig
from ninfer.api.prompting import FrontendPrompts
from ninfer.artifact import ensure_demo_artifact, open_artifact
from ninfer.config import load_settings
from ninfer.engine.engine import Engine
from ninfer.frontend.options import ServerDefaults
from ninfer.service.app import create_app
from ninfer.text.tokenizer import Tokenizer

MODEL = "ninfer-demo"


class NullObserver:
    def rejected(self, *args: Any) -> None: ...
    def started(self, *args: Any) -> None: ...
    def done(self, *args: Any) -> None: ...
    def failed(self, *args: Any) -> None: ...


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    torch.set_num_threads(1)
    settings = load_settings(
        ["+preset=demo", "engine.max_context=1024", "kv.capacity=2048", "sampling.seed=7"]
    )
    artifact = open_artifact(ensure_demo_artifact())
    engine = Engine.from_settings(settings, artifact).start()
    prompts = FrontendPrompts(
        artifact.chat_template, Tokenizer.from_file(artifact.tokenizer_path), ServerDefaults()
    )
    ids = itertools.count(1)
    pipeline = Pipeline(engine, prompts, NullObserver(), PipelineConfig(1024, 64), lambda: next(ids))
    app = create_app(
        ApiContext(model_id=MODEL, pipeline=pipeline),
        lambda: (200, {"status": "ok"}),
        api_key=None,
        cors=False,
        max_request_bytes=1 << 20,
    )
    http = httpx2.Client(transport=httpx2.WSGITransport(app=app))
    yield openai.OpenAI(
        base_url="http://ninfer.test/v1",
        api_key="x",
        max_retries=0,
        http_client=http,
        _strict_response_validation=True,
    )
    engine.shutdown(5.0)


def item_text(item: Any) -> str:
    if item.type == "function_call":
        return item.arguments
    return "".join(c.text for c in item.content or [])


def test_three_turn_chain_reuses_the_prefix(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="Tell me about the sea.", max_output_tokens=16)
    assert first.status in ("completed", "incomplete") and first.usage.output_tokens <= 16
    assert first.usage.input_tokens_details.cached_tokens == 0
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
    stored = client.responses.retrieve(final.id)
    assert stored.model_dump() == final.model_dump()
    counted = client.responses.input_tokens.count(model=MODEL, input="Tell me about the sea.")
    assert counted.input_tokens == first.usage.input_tokens
