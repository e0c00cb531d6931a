"""POST /v1/messages and /v1/messages/count_tokens: Anthropic Messages over the generation pipeline."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import falcon

from ninfer.api import sse
from ninfer.api.compat import Compat
from ninfer.api.context import ApiContext, caller
from ninfer.api.errors import ApiError, internal
from ninfer.api.events import (
    Finished,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)
from ninfer.api.fields import parse_body
from ninfer.api.messages import request as messages_request
from ninfer.api.pipeline import Generation

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def stop_reason(done: Finished) -> tuple[str, str | None]:
    if done.finish == "stop" and done.stop_string is not None:
        return "stop_sequence", done.stop_string
    return _STOP_REASONS[done.finish], None


def usage_body(usage: Usage) -> dict[str, Any]:
    """Anthropic counts cached prompt tokens apart: input + cache_read = the whole prompt."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": usage.completion_tokens,
    }


def message_body(mid: str, model: str, done: Finished) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if done.reasoning:
        content.append({"type": "thinking", "thinking": done.reasoning, "signature": ""})
    if done.content:
        content.append({"type": "text", "text": done.content})
    for call in done.tool_calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)})
    reason, sequence = stop_reason(done)
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_body(done.usage),
    }


def _event(name: str, body: dict[str, Any]) -> bytes:
    return sse.frame({"type": name, **body}, event=name)


class BlockStream:
    """Opens and closes content blocks so indexes run 0..n-1 in order."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None

    def open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        frames = self.close()
        self.index += 1
        self.kind = kind
        frames.append(_event("content_block_start", {"index": self.index, "content_block": block}))
        return frames

    def ensure(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        return [] if self.kind == kind else self.open(kind, block)

    def delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": self.index, "delta": delta})

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [_event("content_block_stop", {"index": self.index})]


def stream_events(gen: Generation, mid: str, model: str) -> Iterator[bytes]:
    blocks = BlockStream()
    try:
        # the first output came after admission, so the engine's cached prefix is known here and
        # message_start carries the same input / cache-read split as the cumulative message_delta
        cached = gen.stats.cached_tokens if gen.stats is not None else 0
        usage = usage_body(Usage(gen.prompt_tokens, 0, cached))
        start: dict[str, Any] = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
        }
        start.update({"stop_reason": None, "stop_sequence": None, "usage": usage})
        yield _event("message_start", {"message": start})
        yield _event("ping", {})
        for event in gen.events():
            if isinstance(event, ReasoningDelta):
                yield from blocks.ensure("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                yield blocks.delta({"type": "thinking_delta", "thinking": event.text})
            elif isinstance(event, TextDelta):
                yield from blocks.ensure("text", {"type": "text", "text": ""})
                yield blocks.delta({"type": "text_delta", "text": event.text})
            elif isinstance(event, ToolCallStart):
                yield from blocks.open(
                    "tool_use", {"type": "tool_use", "id": event.id, "name": event.name, "input": {}}
                )
            elif isinstance(event, ToolCallArgumentsDelta):
                yield blocks.delta({"type": "input_json_delta", "partial_json": event.json_fragment})
            elif isinstance(event, ToolCallEnd):
                yield from blocks.close()
            elif isinstance(event, Finished):
                yield from blocks.close()
                reason, sequence = stop_reason(event)
                delta = {"stop_reason": reason, "stop_sequence": sequence}
                yield _event("message_delta", {"delta": delta, "usage": usage_body(event.usage)})
                yield _event("message_stop", {})
    except ApiError as exc:
        yield sse.frame(exc.body("anthropic"), event="error")
    except Exception as exc:
        logging.getLogger("ninfer.api").exception("messages stream failed")
        yield sse.frame(internal(f"internal error: {type(exc).__name__}").body("anthropic"), event="error")
    finally:
        gen.close()


def request_compat(req: falcon.Request, ctx: ApiContext) -> Compat:
    """The request's compat record, starting with the beta header and query that change nothing here."""
    compat = Compat(ctx.client_compat)
    if req.get_header("anthropic-beta"):
        compat.note("anthropic-beta", "beta header ignored")
    if req.get_param("beta") is not None:
        compat.note("?beta", "beta query parameter ignored")
    return compat


class MessagesResource:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        pipeline = self.ctx.require_pipeline()
        compat = request_compat(req, self.ctx)
        request = messages_request.parse(parse_body(req.context.body), self.ctx, compat)
        gen = pipeline.open(request.job, caller(req))
        mid = f"msg_{uuid.uuid4().hex}"
        resp.set_header("x-request-id", str(gen.request_id))
        if request.job.stream:
            resp.content_type = sse.CONTENT_TYPE
            resp.set_headers(sse.headers())
            resp.stream = stream_events(gen, mid, request.model)
            return
        try:
            done = gen.collect()
        finally:
            gen.close()
        resp.media = message_body(mid, request.model, done)


class CountTokensResource:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        pipeline = self.ctx.require_pipeline()
        compat = request_compat(req, self.ctx)
        job = messages_request.parse_count(parse_body(req.context.body), self.ctx, compat)
        resp.media = {"input_tokens": pipeline.count_tokens(job)}


def routes(ctx: ApiContext) -> list[tuple[str, object]]:
    return [("/v1/messages", MessagesResource(ctx)), ("/v1/messages/count_tokens", CountTokensResource(ctx))]
