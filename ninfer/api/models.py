"""GET /v1/models and /v1/models/{id}: the one public model alias (with `max_model_len`, the
engine's context ceiling, once the model is loaded).

The OpenAI shape by default; a request with Anthropic's headers (``anthropic-version`` or
``x-api-key``, as the Anthropic SDK sends) gets Anthropic's ModelInfo shape, which that SDK
requires (``type: "model"``, ``display_name``, RFC 3339 ``created_at``, ``lifecycle``, a paged
list).
"""

from __future__ import annotations

from datetime import UTC, datetime

import falcon

from ninfer.api.context import ApiContext
from ninfer.api.errors import ApiError


def model_card(ctx: ApiContext, model_id: str) -> dict[str, object]:
    card: dict[str, object] = {
        "id": model_id,
        "object": "model",
        "created": ctx.created,
        "owned_by": "ninfer",
    }
    if ctx.served is not None:  # the context a request may use (vLLM and the seed list it)
        card["max_model_len"] = ctx.served.max_context
    if ctx.synthetic_weights:  # a benchmark artifact: say so wherever the model is listed
        card["synthetic_weights"] = True
    return card


def anthropic_model_info(ctx: ApiContext, model_id: str) -> dict[str, object]:
    created = datetime.fromtimestamp(ctx.created, UTC).isoformat().replace("+00:00", "Z")
    return {
        "type": "model",
        "id": model_id,
        "display_name": model_id,
        "created_at": created,
        "lifecycle": "active",
    }


def wants_anthropic(req: falcon.Request) -> bool:
    """The Anthropic SDK's requests carry ``anthropic-version`` (and ``x-api-key`` for auth)."""
    return req.get_header("anthropic-version") is not None or req.get_header("x-api-key") is not None


class ModelsResource:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        ids = [self.ctx.model_id] if self.ctx.model_id else []
        if wants_anthropic(req):
            resp.media = {
                "data": [anthropic_model_info(self.ctx, m) for m in ids],
                "has_more": False,
                "first_id": ids[0] if ids else None,
                "last_id": ids[-1] if ids else None,
            }
            return
        resp.media = {"object": "list", "data": [model_card(self.ctx, m) for m in ids]}


class ModelResource:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response, model_id: str) -> None:
        if model_id != self.ctx.model_id:
            raise ApiError(404, "model_not_found", f"the model {model_id!r} does not exist", "model")
        if wants_anthropic(req):
            resp.media = anthropic_model_info(self.ctx, model_id)
        else:
            resp.media = model_card(self.ctx, model_id)


def routes(ctx: ApiContext) -> list[tuple[str, object]]:
    return [("/v1/models", ModelsResource(ctx)), ("/v1/models/{model_id:path}", ModelResource(ctx))]
