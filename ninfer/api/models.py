"""GET /v1/models and /v1/models/{id}: the one public model alias."""

from __future__ import annotations

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
    if ctx.synthetic_weights:  # a benchmark artifact: say so wherever the model is listed
        card["synthetic_weights"] = True
    return card


class ModelsResource:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        ids = [self.ctx.model_id] if self.ctx.model_id else []
        resp.media = {"object": "list", "data": [model_card(self.ctx, m) for m in ids]}


class ModelResource:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response, model_id: str) -> None:
        if model_id != self.ctx.model_id:
            raise ApiError(404, "model_not_found", f"the model {model_id!r} does not exist", "model")
        resp.media = model_card(self.ctx, model_id)


def routes(ctx: ApiContext) -> list[tuple[str, object]]:
    return [("/v1/models", ModelsResource(ctx)), ("/v1/models/{model_id:path}", ModelResource(ctx))]
