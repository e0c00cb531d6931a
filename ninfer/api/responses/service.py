"""Responses Core behaviour behind the routes: create (JSON or SSE), stored resources, token counts."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import falcon

from ninfer.api import sse
from ninfer.api.compat import Compat, nearest_effort
from ninfer.api.context import ApiContext
from ninfer.api.errors import ApiError, invalid
from ninfer.api.events import Finished, GenerationJob
from ninfer.api.pipeline import Caller, Generation
from ninfer.api.responses.items import item_ids, media_count, new_id, to_messages
from ninfer.api.responses.logprobs import without_logprobs
from ninfer.api.responses.object import Envelope
from ninfer.api.responses.schema import CreateRequest, parse_create, parse_input_tokens
from ninfer.api.responses.store import ResponseStore, StoredResponse, make_record
from ninfer.api.responses.stream import ResponseSequencer, frame
from ninfer.api.tool_control import answer_constraint, fallback, input_formats
from ninfer.engine.types import SamplingParams
from ninfer.frontend.conversation import Conversation
from ninfer.frontend.options import RequestOptions


def not_found(response_id: str) -> ApiError:
    return ApiError(404, "response_not_found", f"Response with id {response_id!r} not found.", "response_id")


def previous_not_found(response_id: str) -> ApiError:
    return ApiError(
        400,
        "previous_response_not_found",
        f"Previous response with id {response_id!r} not found.",
        "previous_response_id",
    )


class ResponsesService:
    """Create and the stored-Response resources over one pipeline context and one store."""

    def __init__(self, ctx: ApiContext, store: ResponseStore) -> None:
        self.ctx = ctx
        self.store = store

    # ----- create -----
    def parent(self, request: CreateRequest) -> StoredResponse | None:
        rid = request.previous_response_id
        if rid is None:
            return None
        parent = self.store.get(rid)
        if parent is None:
            raise previous_not_found(rid)
        taken = set(item_ids(parent.context))
        for i, item in enumerate(request.input_items):
            if item["id"] in taken:
                raise invalid(f"input[{i}].id", f"duplicate Item id {item['id']!r}", "duplicate_item_id")
        return parent

    def map_effort(self, request: CreateRequest) -> None:
        """--client-compat: an effort the template cannot honour becomes the nearest it can."""
        effort, exposed = request.effort, self.ctx.template_efforts()
        if not self.ctx.client_compat or effort in (None, "none") or effort in exposed:
            return
        request.effort = nearest_effort(effort, exposed)  # None: a template without efforts
        request.compat.map("reasoning.effort", invalid(None, ""), f"{effort!r} -> {request.effort!r}")

    def job(self, request: CreateRequest, parent: StoredResponse | None) -> GenerationJob:
        history = parent.context if parent is not None else ()
        messages = to_messages((*history, *request.input_items), request.instructions)
        tools = request.tool_control.offered(request.tools)
        preserve = request.preserve_thinking
        inherited = parent.preserve_thinking if parent is not None else None
        controls = RequestOptions(
            effort=request.effort,
            effort_param="reasoning.effort",
            preserve_thinking=preserve if preserve is not None else inherited,
        )
        params = SamplingParams(
            max_tokens=request.max_output_tokens or 1,
            temperature=request.temperature,
            top_p=request.top_p,
            logprobs=request.logprobs,
            thinking_budget=request.thinking_budget,
        )
        text = request.text_format
        parts = input_formats(tools, request.tool_formats) if tools else ()
        return GenerationJob(
            constraint=answer_constraint(tools, request.tool_control, text),
            constraint_parts=(*parts, text) if text is not None else parts,
            constraint_fallback=fallback(request.tool_control, text, request.compat.enabled),
            protocol="responses",
            conversation=Conversation(messages=messages, tools=tools),
            controls=controls,
            params=params,
            max_tokens_given=request.max_output_tokens is not None,
            stream=request.stream,
            shape={
                "messages": len(messages),
                "tools": len(tools),
                "media_items": media_count((*history, *request.input_items)),
                "stream": request.stream,
                "input_items": len(request.input_items),
                "previous_response": parent is not None,
                "semantic_change": inherited is not None and preserve is not None and preserve != inherited,
            },
            compat=request.compat.adjustments,
        )

    def envelope(self, request: CreateRequest) -> Envelope:
        return Envelope(
            id=new_id("resp"),
            model=self.ctx.model_id or request.model,
            instructions=request.instructions,
            previous_response_id=request.previous_response_id,
            max_output_tokens=request.max_output_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            tools=request.tool_defs,
            tool_choice=request.tool_choice,
            parallel_tool_calls=request.tool_control.parallel,
            text_format=request.text_echo,
            reasoning_effort=request.effort,
            metadata=request.metadata,
            store=request.store,
            top_logprobs=request.top_logprobs,
        )

    def save(
        self, request: CreateRequest, parent: StoredResponse | None, seq: ResponseSequencer, preserve: bool
    ) -> None:
        """Retain a settled Response (store:true); raises response_store_capacity_exceeded."""
        if request.store and seq.response is not None:
            output = without_logprobs(seq.output)  # the Response keeps them; a continuation needs none
            record = make_record(seq.envelope.id, seq.response, request.input_items, output, preserve, parent)
            self.store.put(record)

    def create(self, body: dict[str, Any], resp: falcon.Response, caller: Caller | None = None) -> None:
        pipeline = self.ctx.require_pipeline()
        request = parse_create(body, self.ctx.vision, Compat(self.ctx.client_compat))
        self.map_effort(request)
        self.ctx.check_model(request.model)
        parent = self.parent(request)
        job = self.job(request, parent)
        envelope = self.envelope(request)
        if request.store:
            empty = make_record(
                envelope.id, envelope.body("in_progress"), request.input_items, [], False, parent
            )
            self.store.check_fits(empty.nbytes)
        gen = pipeline.open(job, caller)
        prepared = gen.prepared
        if request.effort is None:
            envelope.reasoning_effort = prepared.effort if prepared.thinking else "none"
        seq = ResponseSequencer(envelope)
        resp.set_header("x-request-id", str(gen.request_id))
        if request.stream:
            resp.content_type = sse.CONTENT_TYPE
            resp.set_headers(sse.headers())
            resp.stream = self.stream(gen, seq, request, parent)
            return
        try:
            seq.start()
            for event in gen.events():
                if isinstance(event, Finished):
                    seq.settle(event)
                    self.save(request, parent, seq, prepared.preserve_thinking)
                    seq.terminal()
                else:
                    seq.feed(event)
        finally:
            gen.close()
        if seq.response is None:
            raise ApiError(500, "internal_error", "generation ended without a final event")
        resp.media = seq.response

    def stream(
        self, gen: Generation, seq: ResponseSequencer, request: CreateRequest, parent: StoredResponse | None
    ) -> Iterator[bytes]:
        """The SSE body; any failure after the first byte ends the stream with response.failed."""
        try:
            yield b"".join(frame(e) for e in seq.start())
            for event in gen.events():
                if isinstance(event, Finished):
                    out = seq.settle(event)
                    try:
                        self.save(request, parent, seq, gen.prepared.preserve_thinking)
                    except ApiError as exc:
                        out += seq.fail(f"{exc.code}: {exc.message}")
                    else:
                        out.append(seq.terminal())
                    yield b"".join(frame(e) for e in out)
                    return
                out = seq.feed(event)
                if out:
                    yield b"".join(frame(e) for e in out)
            yield b"".join(frame(e) for e in seq.fail("generation ended without a final event"))
        except ApiError as exc:
            yield b"".join(frame(e) for e in seq.fail(f"{exc.code}: {exc.message}"))
        except Exception as exc:
            logging.getLogger("ninfer.api").exception("response stream failed")
            yield b"".join(frame(e) for e in seq.fail(f"internal error: {type(exc).__name__}"))
        finally:
            gen.close()

    # ----- stored resources -----
    def stored(self, response_id: str) -> StoredResponse:
        record = self.store.get(response_id)
        if record is None:
            raise not_found(response_id)
        return record

    def input_items(self, response_id: str, req: falcon.Request) -> dict[str, Any]:
        record = self.stored(response_id)
        known = {"after", "limit", "order", "include", "include[]"}
        for name in req.params:
            if name not in known:
                raise ApiError(400, "unknown_parameter", f"unknown parameter: {name!r}", name)
        if req.get_param_as_list("include") or req.get_param_as_list("include[]"):
            raise ApiError(400, "unsupported_value", "include must be omitted or empty", "include")
        limit_raw = req.get_param("limit")
        try:
            limit = 20 if limit_raw is None else int(limit_raw)
        except ValueError:
            raise invalid("limit", "limit must be an integer", "invalid_type") from None
        if not 1 <= limit <= 100:
            raise invalid("limit", "limit must be between 1 and 100", "invalid_value")
        order = req.get_param("order") or "desc"
        if order not in ("asc", "desc"):
            raise invalid("order", "order must be 'asc' or 'desc'", "invalid_value")
        items = list(record.input_items) if order == "asc" else list(reversed(record.input_items))
        start = 0
        after = req.get_param("after")
        if after is not None:
            ids = item_ids(items)
            if after not in ids:
                raise invalid("after", f"no input Item with id {after!r} in this Response", "invalid_value")
            start = ids.index(after) + 1
        page = items[start : start + limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + limit < len(items),
        }

    def input_tokens(self, body: dict[str, Any]) -> dict[str, Any]:
        model, items = parse_input_tokens(body, self.ctx.vision)
        self.ctx.check_model(model)
        pipeline = self.ctx.require_pipeline()
        job = GenerationJob(
            protocol="responses",
            conversation=Conversation(messages=to_messages(items)),
            controls=RequestOptions(effort_param="reasoning.effort"),
            params=SamplingParams(),
            max_tokens_given=False,
            stream=False,
        )
        return {"object": "response.input_tokens", "input_tokens": pipeline.count_tokens(job)}
