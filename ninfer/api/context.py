"""What every protocol route needs: the loaded pipeline, the public model id and the feature flags."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import falcon

from ninfer.api.errors import ApiError, invalid
from ninfer.api.pipeline import Caller, ClientProbe, Pipeline
from ninfer.api.responses.store import ResponseStore
from ninfer.text.tokenizer import Tokenizer


class RequestContext(falcon.Context):
    """`req.context` on the service's app (`ServiceRequest`): what its middleware records of the
    sender (`ninfer.service.disconnect.ClientWatch`); unset, the defaults below."""

    client_gone: ClientProbe | None = None  # the socket probe (None off gunicorn, e.g. in tests)
    client_request_id: str | None = None  # the caller's valid `x-request-id`


class ServiceRequest(falcon.Request):
    """The request class of the service's app: its `context` is a `RequestContext`."""

    context_type = RequestContext


def caller(req: falcon.Request) -> Caller:
    """The request's sender as the service middleware recorded it on `req.context`."""
    context = req.context
    if not isinstance(context, RequestContext):  # an app built without `ServiceRequest`
        return Caller()
    return Caller(context.client_gone, context.client_request_id)


@dataclass(frozen=True)
class ServedModel:
    """What the HTTP layer knows of the loaded model, built once at load (`ServiceRuntime`)."""

    model_id: str  # the public id: server.model_id, else the artifact's
    max_context: int  # the engine's context ceiling (prompt + output)
    efforts: tuple[str, ...] = ()  # the reasoning efforts the chat template exposes (may be none)


@dataclass
class ApiContext:
    """The configured facts from the start; the served model and its pipeline once loaded
    (`serve`); routes read it per request."""

    vision: bool = False
    model_id: str | None = None  # the public id: the configured one until load, then the served one
    pipeline: Pipeline | None = None
    served: ServedModel | None = None  # set together with the pipeline
    response_store: ResponseStore | None = None  # sized from server.response_store_max_*
    draining: bool = False
    client_compat: bool = False  # --client-compat: accept, ignore or map real clients' extra fields
    synthetic_weights: bool = False  # the artifact's weights are drawn at load (artifact synth)
    created: int = field(default_factory=lambda: int(time.time()))

    def serve(self, served: ServedModel, pipeline: Pipeline) -> None:
        """Loaded: the routes serve `served` through `pipeline` from now on."""
        self.model_id = served.model_id
        self.served = served
        self.pipeline = pipeline  # last: a set pipeline means a set `served`

    def require_pipeline(self) -> Pipeline:
        if self.draining:
            raise ApiError(
                503, "server_shutting_down", "the server is shutting down and accepts no new requests"
            )
        if self.pipeline is None:
            raise ApiError(
                503,
                "model_loading",
                "the model is still loading; retry when /health reports ok",
                retryable=True,
            )
        return self.pipeline

    def require_served(self) -> ServedModel:
        """The loaded model's facts; the same 503s as `require_pipeline` before load or draining."""
        self.require_pipeline()
        assert self.served is not None  # `serve` sets it before the pipeline
        return self.served

    def template_efforts(self) -> tuple[str, ...]:
        """The reasoning efforts the loaded chat template exposes (empty before load or without any)."""
        return self.served.efforts if self.served is not None else ()

    def tokenizer(self) -> Tokenizer:
        """The artifact's tokenizer (`encode`, `decode`, `vocab_size`); needs the loaded pipeline."""
        return self.require_pipeline().prompts.tokenizer

    def check_model(self, model: str) -> None:
        """OpenAI routes: the model field must equal the public model id (404 model_not_found, as OpenAI does)."""
        if self.model_id is not None and model != self.model_id:
            raise ApiError(
                404,
                "model_not_found",
                f"the model {model!r} does not exist; this server serves {self.model_id!r}",
                "model",
            )

    def check_media(self, param: str) -> None:
        if not self.vision:
            raise invalid(
                param, "media input requires a server started with vision enabled", "vision_disabled"
            )
