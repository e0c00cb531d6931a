"""The service's narrow view of the settings: the one place the service reads the Settings groups."""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.config import Settings

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
    drain_timeout_s: float
    metrics_open: bool
    response_store_max_records: int
    response_store_max_mib: int
    header_timeout_s: float
    body_timeout_s: float
    keepalive_s: int
    client_compat: bool

    @property
    def threads(self) -> int:
        """gthread pool size: every open stream holds one thread for its whole life."""
        return self.max_concurrency + self.max_pending + THREAD_HEADROOM


def from_settings(settings: Settings) -> ServiceOptions:
    """The service's fields, read from the validated settings (every default lives in the models)."""
    server, engine, logging_ = settings.server, settings.engine, settings.logging
    telemetry, sampling = settings.telemetry, settings.sampling
    api_key = server.api_key.get_secret_value() if server.api_key is not None else None
    return ServiceOptions(
        host=server.host,
        port=server.port,
        api_key=api_key or None,
        model_id=server.model_id,
        cors=server.cors,
        max_request_bytes=server.max_request_mib * 1024 * 1024,
        max_context=engine.max_context,
        max_concurrency=engine.max_concurrency,
        max_pending=engine.max_pending_requests,
        pending_timeout_ms=engine.pending_timeout_ms,
        default_max_tokens=engine.default_max_tokens,
        vision=settings.vision.enabled,
        thinking_default=not sampling.no_thinking,
        preserve_thinking_default=sampling.preserve_thinking,
        log_level=logging_.level,
        request_log_path=logging_.request_log_jsonl,
        log_stats_interval_ms=logging_.log_stats_interval_ms,
        trace_exporter=telemetry.exporter,
        otlp_endpoint=telemetry.otlp_endpoint,
        service_name=telemetry.service_name,
        artifact=settings.model.artifact,
        drain_timeout_s=server.drain_timeout_s,
        metrics_open=server.metrics_open,
        response_store_max_records=server.response_store_max_records,
        response_store_max_mib=server.response_store_max_mib,
        header_timeout_s=server.header_timeout_s,
        body_timeout_s=server.body_timeout_s,
        keepalive_s=server.keepalive_s,
        client_compat=server.client_compat,
    )
