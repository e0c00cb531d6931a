"""gunicorn as a library: one `ReaderWorker` (gthread that reads requests whole on its event loop)
whose app factory starts the engine on its own thread."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from gunicorn import glogging
from gunicorn.app.base import BaseApplication

from ninfer.config import Settings
from ninfer.service.console import ConsoleFormatter, logger
from ninfer.service.options import worker_threads
from ninfer.service.reader_worker import ReaderTimeouts, worker_class

if TYPE_CHECKING:
    from ninfer.service.app import WsgiApp
    from ninfer.service.runtime import ServiceRuntime

WORKER_CONNECTIONS = 4096  # idle and slow connections cost a descriptor and a buffer, not a thread
MIN_BUFFER_BUDGET = 256 * 1024 * 1024  # all request bytes buffered before their threads, together

RuntimeFactory = Callable[[], "ServiceRuntime"]  # called inside the worker


class ConsoleLogger(glogging.Logger):
    """gunicorn's error log in the service's console format (the access log stays off)."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in self.error_log.handlers:
            handler.setFormatter(ConsoleFormatter())


WORKER_BOOT_ERROR = 3  # gunicorn's arbiter halts (and exits 3) when its worker exits with this


def _exit_boot_error() -> None:
    """The loader failed: end the worker at once; the arbiter stops the server and frees the port."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(WORKER_BOOT_ERROR)


def _post_worker_init(worker: Any) -> None:
    worker.app.install_drain(worker)


def _worker_exit(server: Any, worker: Any) -> None:
    app = worker.app
    if isinstance(app, NinferApplication) and app.runtime is not None:
        app.runtime.shutdown()


class NinferApplication(BaseApplication):
    """Never parses argv nor reads gunicorn.conf.py: the settings are the only configuration."""

    def __init__(self, settings: Settings, runtime_factory: RuntimeFactory) -> None:
        self.settings = settings
        self.runtime_factory = runtime_factory
        self.runtime: ServiceRuntime | None = None
        super().__init__()

    def load_config(self) -> None:
        server = self.settings.server
        values: dict[str, Any] = {
            "bind": [f"{server.host}:{server.port}"],
            "workers": 1,
            "worker_class": worker_class(
                ReaderTimeouts(
                    header_s=server.header_timeout_s,
                    body_s=server.body_timeout_s,
                    max_body_bytes=server.max_request_bytes,
                    buffer_budget=max(MIN_BUFFER_BUDGET, 2 * server.max_request_bytes),
                )
            ),
            "threads": worker_threads(self.settings),
            "worker_connections": WORKER_CONNECTIONS,
            "preload_app": False,
            "timeout": 60,
            "graceful_timeout": int(server.drain_timeout_s) + 5,
            "keepalive": server.keepalive_s,
            "max_requests": 0,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": self.settings.logging.level.lower(),
            "logger_class": ConsoleLogger,
            "post_worker_init": _post_worker_init,
            "worker_exit": _worker_exit,
            "proc_name": "ninfer",
        }
        # gunicorn >= 24 opens a control socket at one fixed per-user path by default; several
        # servers on one host (tests, side-by-side instances) would take it from each other.
        if "control_socket_disable" in self.cfg.settings:
            values["control_socket_disable"] = True
        for key, value in values.items():
            self.cfg.set(key, value)

    def load(self) -> WsgiApp:
        """Runs in the worker: build the runtime, start loading, return the WSGI app at once."""
        from ninfer.service.app import assemble_app

        runtime = self.runtime_factory()
        self.runtime = runtime
        runtime.on_failed = _exit_boot_error
        runtime.start()
        return assemble_app(self.settings.server, runtime.ctx, runtime, runtime.metrics, runtime.tracing)

    def install_drain(self, worker: Any) -> None:
        """SIGTERM: readiness turns 503 and new requests get 503 + Retry-After at once, while the
        listener stays open (a router sees the 503s instead of refused connections); the engine
        drains on a thread (in-flight requests finish within `drain_timeout_s`), then gunicorn's own
        handler stops the worker, which still writes out the last responses, and `worker_exit`
        closes the log once they are released."""
        previous = signal.getsignal(signal.SIGTERM)
        runtime = self.runtime
        if runtime is None:  # gunicorn calls post_worker_init after the worker's load()
            raise RuntimeError("the drain handler needs the runtime that load() builds")

        def drain_then_stop(signum: int, frame: FrameType | None) -> None:
            try:
                runtime.drain()
            finally:
                if callable(previous):
                    previous(signum, frame)

        def on_term(signum: int, frame: FrameType | None) -> None:
            runtime.begin_drain()
            threading.Thread(
                target=drain_then_stop, args=(signum, frame), name="ninfer-drain", daemon=True
            ).start()

        signal.signal(signal.SIGTERM, on_term)
        logging.getLogger("gunicorn.error").debug("drain handler installed")
        logger().debug("worker %s ready for requests", worker.pid)
