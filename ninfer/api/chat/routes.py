"""POST /v1/chat/completions: JSON responses and SSE chunk streams over the generation pipeline."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import falcon

from ninfer.api import sse
from ninfer.api.chat import request as chat_request
from ninfer.api.context import ApiContext, caller
from ninfer.api.events import (
    Finished,
    LogprobsDelta,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
    Usage,
    arguments_json,
)
from ninfer.api.fields import parse_body
from ninfer.api.pipeline import Generation


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def _tool_call(call: ToolCall) -> dict[str, Any]:
    if call.custom:
        return {"id": call.id, "type": "custom", "custom": {"name": call.name, "input": call.input}}
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments_json(call.arguments)},
    }


def completion_body(rid: str, created: int, model: str, done: Finished) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": done.content or None}
    if done.reasoning:
        message["reasoning_content"] = done.reasoning
    if done.tool_calls:
        message["tool_calls"] = [_tool_call(c) for c in done.tool_calls]
    logprobs = None if done.logprobs is None else {"content": list(done.logprobs), "refusal": None}
    body = {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": done.finish, "logprobs": logprobs}],
        "usage": usage_body(done.usage),
    }
    if done.prompt_logprobs is not None:  # the extension: the rendered prompt's tokens, None first
        body["prompt_logprobs"] = list(done.prompt_logprobs)
    return body


class ChunkStream:
    """Builds `chat.completion.chunk` frames for one response."""

    def __init__(self, rid: str, created: int, model: str, include_usage: bool) -> None:
        self.head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
        self.include_usage = include_usage

    def chunk(
        self,
        delta: dict[str, Any],
        finish: str | None = None,
        logprobs: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        if logprobs is not None:
            choice["logprobs"] = logprobs
        body: dict[str, Any] = {**self.head, "choices": [choice], **(extra or {})}
        if self.include_usage:
            body["usage"] = None
        return sse.frame(body)

    def usage(self, usage: Usage) -> bytes:
        return sse.frame({**self.head, "choices": [], "usage": usage_body(usage)})


def stream_chunks(gen: Generation, chunks: ChunkStream) -> Iterator[bytes]:
    """The SSE body; a failure after the first byte becomes an in-band error frame."""
    return sse.openai_stream(_frames(gen, chunks), gen.close, "chat completion")


def _frames(gen: Generation, chunks: ChunkStream) -> Iterator[bytes]:
    scored = gen.prompt_logprobs  # the extension, on the first chunk
    yield chunks.chunk(
        {"role": "assistant", "content": ""},
        extra=None if scored is None else {"prompt_logprobs": list(scored)},
    )
    custom: dict[int, bool] = {}  # whether each tool call is a custom tool's
    for event in gen.events():
        if isinstance(event, LogprobsDelta):
            yield chunks.chunk({}, logprobs={"content": list(event.entries), "refusal": None})
        elif isinstance(event, TextDelta):
            yield chunks.chunk({"content": event.text})
        elif isinstance(event, ReasoningDelta):
            yield chunks.chunk({"reasoning_content": event.text})
        elif isinstance(event, ToolCallStart):
            # a custom call streams like a function call: the name first, then its input
            kind, key = ("custom", "input") if event.custom else ("function", "arguments")
            custom[event.index] = event.custom
            call = {"index": event.index, "id": event.id, "type": kind, kind: {"name": event.name, key: ""}}
            yield chunks.chunk({"tool_calls": [call]})
        elif isinstance(event, ToolCallArgumentsDelta):
            kind, key = ("custom", "input") if custom.get(event.index) else ("function", "arguments")
            yield chunks.chunk({"tool_calls": [{"index": event.index, kind: {key: event.json_fragment}}]})
        elif isinstance(event, Finished):
            yield chunks.chunk({}, event.finish)
            if chunks.include_usage:
                yield chunks.usage(event.usage)


class ChatCompletionsResource:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        pipeline = self.ctx.require_pipeline()
        request = chat_request.parse(parse_body(req.context.body), self.ctx)
        gen = pipeline.open(request.job, caller(req))
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        model = self.ctx.model_id or request.model
        resp.set_header("x-request-id", str(gen.request_id))
        if request.job.stream:
            resp.content_type = sse.CONTENT_TYPE
            resp.set_headers(sse.headers())
            resp.stream = stream_chunks(gen, ChunkStream(rid, created, model, request.include_usage))
            return
        try:
            done = gen.collect()
        finally:
            gen.close()
        resp.media = completion_body(rid, created, model, done)


def routes(ctx: ApiContext) -> list[tuple[str, object]]:
    return [("/v1/chat/completions", ChatCompletionsResource(ctx))]
