"""`serve(settings)`: check what must fail fast in the master, then run gunicorn."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ninfer.config import Settings
from ninfer.service import console
from ninfer.service.request_log import RequestLog, RequestLogError, new_server_instance_id
from ninfer.service.telemetry import TelemetryError, make_exporter

if TYPE_CHECKING:
    from ninfer.service.runtime import EngineFactory

EXIT_STARTUP = 1
EXIT_USAGE = 2  # settings the artifact cannot honour, an artifact that cannot be opened


def preflight(settings: Settings) -> None:
    """Refuse an unusable request log or tracing exporter before any worker starts."""
    RequestLog(settings.logging.request_log_jsonl, "preflight", settings.model.artifact).close()
    make_exporter(settings.telemetry.exporter, settings.telemetry.otlp_endpoint)


def check_artifact(settings: Settings) -> None:
    """Open the artifact (manifest and headers; no weights are read) and refuse every setting it
    cannot honour, before the port is bound: the worker would otherwise fail after it."""
    from ninfer.artifact import ensure_demo_artifact, open_artifact
    from ninfer.config import check_artifact_settings
    from ninfer.config.errors import ConfigError

    artifact = open_artifact(settings.model.artifact or str(ensure_demo_artifact()))
    check_artifact_settings(settings, artifact)
    if artifact.quantized:
        from ninfer.bootstrap import unsupported_formats
        from ninfer.service.gpu_probe import device_capability

        why = unsupported_formats(artifact, device_capability(settings.engine.device))
        if why is not None:
            raise ConfigError(f"{artifact.path}: {why}")


def serve(
    settings: Settings, argv: Sequence[str] | None = None, engine_factory: EngineFactory | None = None
) -> None:
    """Serve until SIGTERM/SIGINT. Exits 2 with one line when the artifact cannot honour the
    settings, 1 when the log or exporter is unusable; a worker that fails before it is ready
    stops the server (gunicorn exits 3)."""
    from ninfer.artifact import ArtifactError
    from ninfer.config.errors import ConfigError
    from ninfer.service.gunicorn_app import NinferApplication
    from ninfer.service.runtime import ServiceRuntime, default_engine_factory

    console.setup(settings.logging.level)
    args = list(sys.argv if argv is None else argv)
    prog = args[0] if args else "ninfer"
    try:
        preflight(settings)
    except (RequestLogError, TelemetryError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_STARTUP) from None
    try:
        check_artifact(settings)
    except (ConfigError, ArtifactError) as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    instance_id = new_server_instance_id()

    def runtime_factory() -> ServiceRuntime:
        return ServiceRuntime(settings, instance_id, args, engine_factory or default_engine_factory)

    NinferApplication(settings, runtime_factory).run()
