"""The Falcon WSGI application: middleware, error envelopes, health and the protocol routes."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import falcon

from ninfer.api.context import ApiContext
from ninfer.service.disconnect import ClientWatch
from ninfer.service.middleware import ApiKeyAuth, BodyLimit, install_error_handlers

# Protocol adapters; each module exposes `routes(ctx) -> [(path, resource)]`. A module that is not
# present in this build (the Responses adapter is optional) is skipped.
ROUTE_MODULES = (
    "ninfer.api.models",
    "ninfer.api.chat_completions",
    "ninfer.api.messages",
    "ninfer.api.responses",
    "ninfer.api.completions",
    "ninfer.api.tokenize",
)


class HealthResource:
    """200 {"status":"ok"} once the engine is ready; 503 while loading (or after a failed load)."""

    def __init__(self, status: Callable[[], tuple[int, dict[str, object]]]) -> None:
        self._status = status

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        code, body = self._status()
        resp.status = falcon.code_to_http_status(code)
        resp.media = body


def _route_modules() -> list[object]:
    mods = []
    for name in ROUTE_MODULES:
        try:
            mods.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return mods


def create_app(
    ctx: ApiContext,
    health: Callable[[], tuple[int, dict[str, object]]],
    *,
    api_key: str | None,
    cors: bool,
    max_request_bytes: int,
    extra_routes: list[tuple[str, object]] | None = None,
) -> falcon.App:
    middleware: list[object] = []
    if api_key:
        middleware.append(ApiKeyAuth(api_key))
    middleware.append(BodyLimit(max_request_bytes))
    middleware.append(ClientWatch())
    app = falcon.App(middleware=middleware, cors_enable=cors)
    app.req_options.strip_url_path_trailing_slash = True
    install_error_handlers(app)
    app.add_route("/health", HealthResource(health))
    for mod in _route_modules():
        for path, resource in mod.routes(ctx):  # type: ignore[attr-defined]
            app.add_route(path, resource)
    for path, resource in extra_routes or []:
        app.add_route(path, resource)
    return app
