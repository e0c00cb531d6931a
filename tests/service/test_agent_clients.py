"""openai-agents (the OpenAI Agents SDK) runs a tool-using agent against the server.

`scripted_compat_server` runs the scripted engine (`fake_engine.py`) with
`--client-compat`: offered a weather tool it calls `get_weather` with `{"city": "Paris"}`, and once
the last turn holds the tool's result it answers in plain text, so every run is exactly two
generations (a tool call, then the final answer). Both model classes run, each whole and streamed: `OpenAIChatCompletionsModel` over
Chat Completions and `OpenAIResponsesModel` over Responses. Tracing is disabled (it would export
to OpenAI). Each run must complete with the scripted answer, having run the tool once, with every
HTTP response a 2xx and both generations done in the request log (`Traffic`).

The SDK's function tools are strict by default (`strict: true` schemas), which the server enforces
with a grammar; the scripted engine cannot constrain output, so `--client-compat` drops that
constraint and records it on each request (without the flag such an engine answers 400).
"""

from __future__ import annotations

import asyncio

import pytest
from agents import (
    Agent,
    Model,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from tests.service.conftest import API_KEY, MODEL, Server, Traffic

ANSWER = "Hello from the scripted engine."
PROTOCOL = {"chat": "chat_completions", "responses": "responses"}


@pytest.fixture(scope="module", autouse=True)
def no_tracing() -> None:
    set_tracing_disabled(True)


def _model(api: str, client: AsyncOpenAI) -> Model:
    if api == "chat":
        return OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    return OpenAIResponsesModel(model=MODEL, openai_client=client)


async def _run(url: str, api: str, stream: bool, cities: list[str]) -> str:
    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        cities.append(city)
        return "sunny"

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    agent = Agent(
        name="weather", instructions="Answer briefly.", tools=[get_weather], model=_model(api, client)
    )
    try:
        if stream:
            streamed = Runner.run_streamed(agent, "Weather in Paris?")
            async for _ in streamed.stream_events():
                pass
            return str(streamed.final_output)
        return str((await Runner.run(agent, "Weather in Paris?")).final_output)
    finally:
        await client.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_tool_using_agent_run(scripted_compat_server: Server, api: str, stream: bool) -> None:
    scripted_server = scripted_compat_server
    traffic = Traffic(scripted_server)
    cities: list[str] = []
    assert asyncio.run(_run(scripted_server.url, api, stream, cities)) == ANSWER
    assert cities == ["Paris"]
    done = traffic.check()
    assert [e["finish_reason"] for e in done] == ["tool_calls", "stop"]
    assert all(e["protocol"] == PROTOCOL[api] for e in done)
    for event in done:
        mapped = {a["param"] for a in event["compat_adjustments"] if a["action"] == "mapped"}
        assert "tools" in mapped, event["compat_adjustments"]  # strict arguments not enforced here
