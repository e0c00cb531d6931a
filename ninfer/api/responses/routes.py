"""OpenAI Responses Core routes: /v1/responses and its stored-Response resources."""

from __future__ import annotations

import falcon

from ninfer.api.context import ApiContext, caller
from ninfer.api.errors import ApiError
from ninfer.api.fields import parse_body
from ninfer.api.responses.schema import LOGPROBS_INCLUDE
from ninfer.api.responses.service import ResponsesService, not_found
from ninfer.api.responses.store import ResponseStore

DEFAULT_MAX_RECORDS = 1024  # server.response_store_max_records (used when no store is configured)
DEFAULT_MAX_MIB = 256  # server.response_store_max_mib


class ResponsesResource:
    def __init__(self, service: ResponsesService) -> None:
        self.service = service

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.service.create(parse_body(req.context.body), resp, caller(req))


class ResponseResource:
    def __init__(self, service: ResponsesService) -> None:
        self.service = service

    def on_get(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        if req.get_param("stream") not in (None, "false"):
            raise ApiError(
                400, "unsupported_value", "replaying a stored Response as a stream is not supported", "stream"
            )
        # The stored object is what the create returned: its text logprobs when that asked for them.
        include = (req.get_param_as_list("include") or []) + (req.get_param_as_list("include[]") or [])
        if any(value != LOGPROBS_INCLUDE for value in include):
            raise ApiError(400, "unsupported_value", f"include may only hold {LOGPROBS_INCLUDE!r}", "include")
        resp.media = self.service.stored(response_id).response

    def on_delete(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        if not self.service.store.delete(response_id):
            raise not_found(response_id)
        resp.media = {"id": response_id, "object": "response.deleted", "deleted": True}


class InputItemsResource:
    def __init__(self, service: ResponsesService) -> None:
        self.service = service

    def on_get(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        resp.media = self.service.input_items(response_id, req)


class InputTokensResource:
    def __init__(self, service: ResponsesService) -> None:
        self.service = service

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.service.input_tokens(parse_body(req.context.body))


class CancelResource:
    def __init__(self, service: ResponsesService) -> None:
        self.service = service

    def on_post(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        self.service.stored(response_id)
        raise ApiError(
            400,
            "background_not_supported",
            "only background Responses can be cancelled, and this server does not run background Responses",
        )


class CompactResource:
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        raise ApiError(400, "compaction_not_supported", "this server does not compact Responses")


def routes(ctx: ApiContext) -> list[tuple[str, object]]:
    """The route table; the store comes from `ctx.response_store` when the service sets one."""
    store = ctx.response_store
    if store is None:
        store = ResponseStore(DEFAULT_MAX_RECORDS, DEFAULT_MAX_MIB)
    service = ResponsesService(ctx, store)
    return [
        ("/v1/responses", ResponsesResource(service)),
        ("/v1/responses/input_tokens", InputTokensResource(service)),
        ("/v1/responses/compact", CompactResource()),
        ("/v1/responses/{response_id}", ResponseResource(service)),
        ("/v1/responses/{response_id}/input_items", InputItemsResource(service)),
        ("/v1/responses/{response_id}/cancel", CancelResource(service)),
    ]
