"""LangChain (`langchain-openai` over Chat Completions and Responses, `langchain-anthropic`) and
LiteLLM (as an OpenAI-compatible provider) invoke and stream against the server.

They share the package's `compat_server` (the terse model: turns end after a few tokens). Each
client makes one whole and one streamed call; both must succeed, every HTTP response must be a
2xx and both generations done in the request log (`Traffic`). None of these clients needs
`--client-compat`: their requests carry no adjustment, so the strict contract accepts them too.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_openai import ChatOpenAI

from tests.service.conftest import API_KEY, MODEL, Server, Traffic

MAX_TOKENS = 16  # the Responses minimum for max_output_tokens
PROMPT = "Say hi"


def _no_compat(done: list[dict], protocol: str) -> None:
    assert [e["protocol"] for e in done] == [protocol] * len(done)
    assert [e["compat_adjustments"] for e in done] == [[]] * len(done)


def _openai(url: str, **extra: Any) -> BaseChatModel:
    return ChatOpenAI(
        model=MODEL, base_url=f"{url}/v1", api_key=API_KEY, max_tokens=MAX_TOKENS, max_retries=0, **extra
    )


def _anthropic(url: str) -> BaseChatModel:
    return ChatAnthropic(model=MODEL, base_url=url, api_key=API_KEY, max_tokens=MAX_TOKENS, max_retries=0)


LANGCHAIN: dict[str, tuple[Callable[[str], BaseChatModel], str]] = {
    "openai-chat": (lambda url: _openai(url, stream_usage=True), "chat_completions"),
    "openai-responses": (lambda url: _openai(url, use_responses_api=True), "responses"),
    "anthropic": (_anthropic, "messages"),
}


@pytest.mark.parametrize("name", list(LANGCHAIN))
def test_langchain_invoke_and_stream(compat_server: Server, name: str) -> None:
    make, protocol = LANGCHAIN[name]
    llm = make(compat_server.url)
    traffic = Traffic(compat_server)
    reply = llm.invoke(PROMPT)
    assert isinstance(reply, AIMessage) and reply.usage_metadata, reply
    chunks = list(llm.stream(PROMPT))
    assert chunks and all(isinstance(c, AIMessageChunk) for c in chunks)
    whole = sum(chunks[1:], chunks[0])
    assert whole.usage_metadata and whole.usage_metadata["output_tokens"] >= 1, whole
    _no_compat(traffic.check(), protocol)


@pytest.fixture(scope="module")
def litellm() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # the bundled cost map, not a download
        yield importlib.import_module("litellm")


def test_litellm_openai_provider(compat_server: Server, litellm: Any) -> None:
    call = {
        "model": f"openai/{MODEL}",
        "api_base": f"{compat_server.url}/v1",
        "api_key": API_KEY,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "num_retries": 0,
    }
    traffic = Traffic(compat_server)
    reply = litellm.completion(**call)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens >= 1
    chunks = list(litellm.completion(**call, stream=True, stream_options={"include_usage": True}))
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish in (["stop"], ["length"]), chunks
    assert any(getattr(c, "usage", None) and c.usage.completion_tokens >= 1 for c in chunks), chunks
    _no_compat(traffic.check(), "chat_completions")
