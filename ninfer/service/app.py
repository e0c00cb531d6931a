"""The Falcon WSGI application: middleware, error envelopes, health and the protocol routes;
`api_context` and `assemble_app` build the served API from the runtime's parts."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import falcon

from ninfer.api.context import ApiContext, ServiceRequest
from ninfer.api.responses.store import ResponseStore
from ninfer.config import Settings
from ninfer.service.disconnect import ClientWatch
from ninfer.service.metrics import CONTENT_TYPE
from ninfer.service.middleware import ApiKeyAuth, BodyLimit, HttpCount, install_error_handlers

if TYPE_CHECKING:
    from ninfer.config.groups import ServerSettings
    from ninfer.service.metrics import ServiceMetrics
    from ninfer.service.telemetry import Tracing

Status = Callable[[], tuple[int, dict[str, object]]]  # -> (HTTP status code, JSON body)
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

# Protocol adapters; each module exposes `routes(ctx) -> [(path, resource)]`. A module that is not
# present in this build (the Responses adapter is optional) is skipped.
ROUTE_MODULES = (
    "ninfer.api.models",
    "ninfer.api.chat.routes",
    "ninfer.api.messages.routes",
    "ninfer.api.responses.routes",
    "ninfer.api.completions",
    "ninfer.api.tokenize",
)


class HealthResource:
    """Readiness (/health): 200 {"status":"ok"} once the engine is ready; 503 while loading, draining
    or after a failed load. Liveness (/livez, and / for clients that warm a connection with an
    unauthenticated `HEAD /`, as Claude Code does): the same resource over `runtime.liveness`."""

    def __init__(self, status: Status) -> None:
        self._status = status

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        code, body = self._status()
        resp.status = falcon.code_to_http_status(code)
        resp.media = body

    on_head = on_get  # the WSGI server sends no body for HEAD


class MetricsResource:
    """GET /metrics: the Prometheus text exposition (auth follows --api-key unless --metrics-open)."""

    def __init__(self, render: Callable[[], bytes], content_type: str) -> None:
        self._render = render
        self._content_type = content_type

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = self._content_type
        resp.data = self._render()


def _route_modules() -> list[ModuleType]:
    return [importlib.import_module(name) for name in ROUTE_MODULES]


def create_app(
    ctx: ApiContext,
    health: Status,
    *,
    api_key: str | None,
    cors: bool,
    max_request_bytes: int,
    extra_routes: list[tuple[str, object]] | None = None,
    liveness: Status | None = None,
    metrics: Callable[[], bytes] | None = None,
    metrics_open: bool = False,
    observe_http: Callable[[str, str, int], None] | None = None,
) -> falcon.App[Any, Any]:
    middleware: list[Any] = []
    counter = HttpCount(observe_http) if observe_http is not None else None
    if counter is not None:
        middleware.append(counter)
    if api_key:
        middleware.append(ApiKeyAuth(api_key, frozenset({"/metrics"}) if metrics_open else frozenset()))
    middleware.append(BodyLimit(max_request_bytes))
    middleware.append(ClientWatch())
    app = falcon.App(request_type=ServiceRequest, middleware=middleware, cors_enable=cors)
    app.req_options.strip_url_path_trailing_slash = True
    install_error_handlers(app)
    routes: list[tuple[str, object]] = [("/health", HealthResource(health))]
    routes.append(("/", HealthResource(liveness or health)))
    if liveness is not None:
        routes.append(("/livez", HealthResource(liveness)))
    if metrics is not None:
        routes.append(("/metrics", MetricsResource(metrics, CONTENT_TYPE)))
    for mod in _route_modules():
        routes.extend(mod.routes(ctx))
    routes.extend(extra_routes or [])
    for path, resource in routes:
        app.add_route(path, resource)
    if counter is not None:
        counter.static = frozenset(path for path, _ in routes if "{" not in path)
    return app


class ServiceState(Protocol):
    """The worker's readiness and liveness (`ServiceRuntime`)."""

    def health(self) -> tuple[int, dict[str, object]]: ...

    def liveness(self) -> tuple[int, dict[str, object]]: ...


def api_context(settings: Settings) -> ApiContext:
    """What the routes read, from the settings alone; the runtime serves the model into it at load."""
    server = settings.server
    return ApiContext(
        vision=settings.vision.enabled,
        model_id=server.model_id,
        client_compat=server.client_compat,
        response_store=ResponseStore(server.response_store_max_records, server.response_store_max_mib),
    )


def assemble_app(
    server: ServerSettings, ctx: ApiContext, state: ServiceState, metrics: ServiceMetrics, tracing: Tracing
) -> WsgiApp:
    """The worker's WSGI app: the Falcon app over `ctx` with health, liveness and metrics, inside
    the request-id, tracing and router-compatibility WSGI middleware."""
    from ninfer.service.request_id import RequestIdMiddleware
    from ninfer.service.router_compat import RouterCompatMiddleware
    from ninfer.service.telemetry import TracingMiddleware

    app = create_app(
        ctx,
        state.health,
        api_key=server.api_key_value,
        cors=server.cors,
        max_request_bytes=server.max_request_bytes,
        liveness=state.liveness,
        metrics=metrics.render,
        metrics_open=server.metrics_open,
        observe_http=metrics.observe_http,
    )
    return RequestIdMiddleware(TracingMiddleware(RouterCompatMiddleware(app), tracing))
