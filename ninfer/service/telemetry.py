"""OpenTelemetry tracing: a WSGI span per HTTP request that outlives the stream, and phase child spans."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ninfer.api.events import GenerationJob
from ninfer.api.ports import Prepared
from ninfer.service.request_id import client_request_id

EXPORTERS = ("none", "console", "otlp")


class TelemetryError(Exception):
    """The configured exporter cannot be built (startup aborts with this message)."""


def make_exporter(kind: str, endpoint: str | None) -> SpanExporter | None:
    if kind == "none":
        return None
    if kind == "console":
        return ConsoleSpanExporter()
    if kind == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise TelemetryError(
                "telemetry.exporter=otlp needs the package opentelemetry-exporter-otlp-proto-http "
                "(pip install 'ninfer[otlp]')"
            ) from None
        return OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
    raise TelemetryError(f"unknown telemetry.exporter {kind!r}; expected one of {', '.join(EXPORTERS)}")


class Tracing:
    """Owns a TracerProvider (never the global one); a disabled instance makes every call a no-op."""

    def __init__(
        self, provider: TracerProvider | None, model_id: Callable[[], str | None] = lambda: None
    ) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("ninfer.service") if provider else None
        self.model_id = model_id
        self._spans: dict[int, trace.Span] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, kind: str, endpoint: str | None, service_name: str, instance_id: str) -> Tracing:
        exporter = make_exporter(kind, endpoint)
        if exporter is None:
            return cls(None)
        resource = Resource.create({"service.name": service_name, "service.instance.id": instance_id})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider)

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def request_started(
        self, request_id: int, job: GenerationJob, prepared: Prepared, max_tokens: int
    ) -> None:
        if self.tracer is None:
            return
        span = trace.get_current_span()
        if not span.is_recording():
            return
        span.set_attribute("ninfer.request_id", request_id)
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.request.model", self.model_id() or "")
        span.set_attribute("gen_ai.request.max_tokens", max_tokens)  # the engine's resolved entitlement
        span.set_attribute("gen_ai.request.stream", bool(job.stream))
        span.set_attribute("gen_ai.usage.input_tokens", len(prepared.token_ids))
        with self._lock:
            self._spans[request_id] = span

    def request_finished(
        self, request_id: int, summary: dict[str, Any] | None, stats: Any, error: Any
    ) -> None:
        """Record phase child spans after the fact, laid back-to-back ending now."""
        with self._lock:
            span = self._spans.pop(request_id, None)
        if self.tracer is None or span is None:
            return
        if summary is not None:
            span.set_attribute("gen_ai.usage.output_tokens", summary["completion_tokens"])
            span.set_attribute("gen_ai.response.finish_reasons", [summary["finish_reason"]])
        if error is not None:
            span.set_attribute("error.type", error.code)
        if stats is None:
            return
        parent = trace.set_span_in_context(span)
        end = time.time_ns()
        phases = [
            ("decode", stats.decode_s),
            ("prefill", stats.prefill_s),
            ("queue", stats.queue_s),
            ("prepare", summary["prepare_s"] if summary else 0.0),
        ]
        for name, seconds in phases:
            start = end - int(seconds * 1e9)
            child = self.tracer.start_span(name, context=parent, start_time=start)
            child.set_attribute("gen_ai.request.model", self.model_id() or "")
            if name == "decode" and summary is not None:
                child.set_attribute("gen_ai.usage.output_tokens", summary["completion_tokens"])
            if name == "prefill":
                child.set_attribute("gen_ai.usage.input_tokens", stats.prompt_tokens)
                child.set_attribute("ninfer.cached_tokens", stats.cached_tokens)
            child.end(end_time=end)
            end = start

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


class _EnvironGetter(Getter[dict[str, Any]]):
    """Reads W3C trace-context headers from a WSGI environ (`traceparent` -> HTTP_TRACEPARENT)."""

    def get(self, carrier: dict[str, Any], key: str) -> list[str] | None:
        value = carrier.get("HTTP_" + key.upper().replace("-", "_"))
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: dict[str, Any]) -> list[str]:
        return [k[5:].lower().replace("_", "-") for k in carrier if k.startswith("HTTP_")]


_PROPAGATOR = TraceContextTextMapPropagator()
_ENVIRON_GETTER = _EnvironGetter()


class TracingMiddleware:
    """WSGI middleware: the SERVER span ends only after the body iterable is exhausted or closed."""

    def __init__(self, app: Callable[..., Iterable[bytes]], tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        tracer = self.tracing.tracer
        if tracer is None:
            return self.app(environ, start_response)
        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/")
        # W3C traceparent / tracestate: the SERVER span joins the caller's (router's) trace
        parent = _PROPAGATOR.extract(environ, getter=_ENVIRON_GETTER)
        span = tracer.start_span(f"{method} {path}", context=parent, kind=trace.SpanKind.SERVER)
        given = client_request_id(environ)
        if given is not None:
            span.set_attribute("http.request.header.x-request-id", given)
        span.set_attribute("http.request.method", method)
        span.set_attribute("url.path", path)

        def _start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            code = int(status.split(" ", 1)[0])
            span.set_attribute("http.response.status_code", code)
            if code >= 500:
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            body = self.app(environ, _start)
        except BaseException:
            span.end()
            raise
        finally:
            otel_context.detach(token)
        return _SpanBody(body, span)


class _SpanBody:
    """Wraps the WSGI iterable; `close()` forwards to the app's iterable, then ends the span."""

    def __init__(self, body: Iterable[bytes], span: trace.Span) -> None:
        self._body = body
        self._span = span

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)  # PEP 3333: an iterable may have close()
            if close is not None:
                close()
        finally:
            self._span.end()
