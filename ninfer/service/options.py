"""The service's narrow view of the settings: the one place that reads the Settings groups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Threads beyond max_concurrency + max_pending for /health, /v1/models, errors and rejections.
# Requests reach a thread only once fully read (`reader_worker`), so these are never held by
# slow or idle clients.
THREAD_HEADROOM = 16


@dataclass(frozen=True)
class ServiceOptions:
    host: str
    port: int
    api_key: str | None
    model_id: str | None
    cors: bool
    max_request_bytes: int
    max_context: int
    max_concurrency: int
    max_pending: int
    pending_timeout_ms: int
    default_max_tokens: int
    vision: bool
    thinking_default: bool
    preserve_thinking_default: bool
    log_level: str
    request_log_path: str | None
    log_stats_interval_ms: int
    trace_exporter: str
    otlp_endpoint: str | None
    service_name: str
    artifact: str | None
    drain_timeout_s: float = 30.0
    metrics_open: bool = False
    response_store_max_records: int = 1024
    response_store_max_mib: int = 256
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keepalive_s: int = 5
    client_compat: bool = False

    @property
    def threads(self) -> int:
        """gthread pool size: every open stream holds one thread for its whole life."""
        return self.max_concurrency + self.max_pending + THREAD_HEADROOM


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return getattr(obj, name, default) if obj is not None else default


def from_settings(settings: Any) -> ServiceOptions:
    server, engine = settings.server, settings.engine
    logging_, telemetry = _get(settings, "logging"), _get(settings, "telemetry")
    sampling, vision, model = _get(settings, "sampling"), _get(settings, "vision"), _get(settings, "model")
    api_key = _get(server, "api_key")
    if api_key is not None and hasattr(api_key, "get_secret_value"):
        api_key = api_key.get_secret_value()
    return ServiceOptions(
        host=server.host,
        port=int(server.port),
        api_key=api_key or None,
        model_id=_get(server, "model_id"),
        cors=bool(_get(server, "cors", False)),
        max_request_bytes=int(_get(server, "max_request_mib", 384)) * 1024 * 1024,
        max_context=int(engine.max_context),
        max_concurrency=int(engine.max_concurrency),
        max_pending=int(_get(engine, "max_pending_requests", 16)),
        pending_timeout_ms=int(_get(engine, "pending_timeout_ms", 30000)),
        default_max_tokens=int(_get(engine, "default_max_tokens", 8192)),
        vision=bool(_get(vision, "enabled", False)),
        thinking_default=not bool(_get(sampling, "no_thinking", False)),
        preserve_thinking_default=bool(_get(sampling, "preserve_thinking", False)),
        log_level=str(_get(logging_, "level", "INFO")),
        request_log_path=_get(logging_, "request_log_jsonl"),
        log_stats_interval_ms=int(_get(logging_, "log_stats_interval_ms", 5000)),
        trace_exporter=str(_get(telemetry, "exporter", "none")),
        otlp_endpoint=_get(telemetry, "otlp_endpoint"),
        service_name=str(_get(telemetry, "service_name", "ninfer")),
        artifact=None if _get(model, "artifact") is None else str(model.artifact),
        drain_timeout_s=float(_get(server, "drain_timeout_s", 30.0)),
        metrics_open=bool(_get(server, "metrics_open", False)),
        response_store_max_records=int(_get(server, "response_store_max_records", 1024)),
        response_store_max_mib=int(_get(server, "response_store_max_mib", 256)),
        header_timeout_s=float(_get(server, "header_timeout_s", 10.0)),
        body_timeout_s=float(_get(server, "body_timeout_s", 60.0)),
        keepalive_s=int(_get(server, "keepalive_s", 5)),
        client_compat=bool(_get(server, "client_compat", False)),
    )
