"""`serve(settings)`: check what must fail fast in the master, then run gunicorn."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from ninfer.service import console
from ninfer.service.options import ServiceOptions, from_settings
from ninfer.service.request_log import RequestLog, RequestLogError, new_server_instance_id
from ninfer.service.telemetry import TelemetryError, make_exporter

EXIT_STARTUP = 1


def preflight(options: ServiceOptions) -> None:
    """Refuse an unusable request log or tracing exporter before any worker starts."""
    RequestLog(options.request_log_path, "preflight", options.artifact).close()
    make_exporter(options.trace_exporter, options.otlp_endpoint)


def serve(
    settings: Any, argv: Sequence[str] | None = None, engine_factory: Callable[..., Any] | None = None
) -> None:
    """Serve until SIGTERM/SIGINT; exits 1 with one line when startup checks fail."""
    from ninfer.service.gunicorn_app import NinferApplication
    from ninfer.service.runtime import ServiceRuntime, default_engine_factory

    options = from_settings(settings)
    console.setup(options.log_level)
    try:
        preflight(options)
    except (RequestLogError, TelemetryError) as exc:
        print(f"ninfer: error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_STARTUP) from None
    instance_id = new_server_instance_id()
    args = list(sys.argv if argv is None else argv)

    def runtime_factory() -> ServiceRuntime:
        return ServiceRuntime(settings, options, instance_id, args, engine_factory or default_engine_factory)

    NinferApplication(options, runtime_factory).run()
