"""The worker's composition root: artifact, engine (loaded on its own thread), pipeline, log, tracing."""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ninfer.api.context import ApiContext, ServedModel
from ninfer.api.pipeline import Pipeline
from ninfer.config import Settings
from ninfer.service.app import api_context
from ninfer.service.console import logger
from ninfer.service.engine_view import EngineView
from ninfer.service.metrics import ServiceMetrics
from ninfer.service.options import worker_threads
from ninfer.service.recorder import Recorder
from ninfer.service.request_log import RequestLog, redact_argv
from ninfer.service.telemetry import Tracing
from ninfer.service.throughput import ThroughputReporter

if TYPE_CHECKING:
    from ninfer.artifact import Artifact

RELEASE_WAIT_S = 5.0  # after the engine drained: bound on waiting for responses to be released

# (settings, artifact) -> a loaded engine (`ninfer.bootstrap.build_engine`, or a test fake)
EngineFactory = Callable[[Settings, "Artifact"], EngineView]


def default_engine_factory(settings: Settings, artifact: Artifact) -> EngineView:
    from ninfer.bootstrap import build_engine

    return build_engine(settings, artifact)


class ServiceRuntime:
    """One worker's lifecycle: load (on a thread; `start()` returns at once), readiness, drain and
    shutdown, over the parts the API is assembled from (`ninfer.service.app.assemble_app`)."""

    def __init__(
        self,
        settings: Settings,
        instance_id: str,
        argv: list[str],
        engine_factory: EngineFactory = default_engine_factory,
        tracing: Tracing | None = None,
        ctx: ApiContext | None = None,
    ) -> None:
        self.settings = settings
        self.instance_id = instance_id
        self.argv = argv
        self.engine_factory = engine_factory
        telemetry = settings.telemetry
        self.ctx = ctx if ctx is not None else api_context(settings)
        self.log = RequestLog(settings.logging.request_log_jsonl, instance_id, settings.model.artifact)
        self.tracing = tracing or Tracing.from_config(
            telemetry.exporter, telemetry.otlp_endpoint, telemetry.service_name, instance_id
        )
        self.tracing.model_id = lambda: self.ctx.model_id
        self.engine: EngineView | None = None
        self.metrics = ServiceMetrics(lambda: self.ctx.model_id, lambda: self.engine if self.ready else None)
        self.recorder = Recorder(self.log, self.tracing, self.metrics)
        self.ready = False
        self.error: str | None = None
        self.reporter: ThroughputReporter | None = None
        self._ids = itertools.count(1)
        self._id_lock = threading.Lock()
        self._loader = threading.Thread(target=self._load, name="ninfer-loader", daemon=True)
        self._drain_lock = threading.Lock()
        self._drained = False
        self._closed = False
        self.on_failed: Callable[[], None] | None = None  # a failed load ends the process (gunicorn_app)

    def next_request_id(self) -> int:
        with self._id_lock:
            return next(self._ids)

    def start(self) -> None:
        self._loader.start()

    def health(self) -> tuple[int, dict[str, object]]:
        """503 `error` after a failed load or once the engine thread died (`engine.error`)."""
        error = self._error()
        if error is not None:
            return 503, {"status": "error", "message": error}
        if self.ctx.draining:
            return 503, {"status": "draining"}
        if not self.ready or self.engine is None:
            return 503, {"status": "loading"}
        late = self.engine.late_compiles()
        return 200, {"status": "ok", "late_compiles": late, "late_kernels": self.engine.late_kernels()}

    def _error(self) -> str | None:
        """Why the server cannot serve: a failed load, or the engine thread's death."""
        return self.error or (self.engine.error if self.engine is not None else None)

    def liveness(self) -> tuple[int, dict[str, object]]:
        """200 while the process is alive, loading and draining included (a liveness probe must not
        kill a pod during a cold start); 503 once the load failed or the engine thread died."""
        error = self._error()
        if error is not None:
            return 503, {"status": "error", "message": error}
        state = "draining" if self.ctx.draining else "ok" if self.ready else "loading"
        return 200, {"status": state}

    def _load(self) -> None:
        try:
            self._load_inner()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            logger().exception("startup failed")
            if self.on_failed is not None:  # never a server that stays up without a model
                self.log.close()
                self.on_failed()

    def _load_inner(self) -> None:
        from ninfer.api.prompting import FrontendPrompts
        from ninfer.artifact import ensure_demo_artifact, open_artifact
        from ninfer.config import check_artifact_settings
        from ninfer.frontend.options import ServerDefaults
        from ninfer.service.compile_cache import setup_compile_cache
        from ninfer.text.tokenizer import Tokenizer

        cache = setup_compile_cache()  # before torch compiles or loads any kernel
        path = self.settings.model.artifact
        if path is None:  # the demo: found in the cache dir, or built there now
            t0 = time.monotonic()
            path = str(ensure_demo_artifact())
            logger().info("demo artifact %s ready in %.3fs (found or built)", path, time.monotonic() - t0)
        t0 = time.monotonic()
        artifact = open_artifact(path)
        logger().info("artifact %s (%s) opened in %.3fs", path, artifact.model_id, time.monotonic() - t0)
        if artifact.synthetic is not None:
            logger().warning(
                "artifact %s has SYNTHETIC weights (drawn from seed %s at load): for benchmarks; "
                "its text is not meaningful", path, artifact.synthetic["seed"],
            )  # fmt: skip
            self.ctx.synthetic_weights = True
        # settings the artifact cannot honour fail before any allocation
        check_artifact_settings(self.settings, artifact)
        tokenizer = Tokenizer.from_file(artifact.tokenizer_path)
        sampling = self.settings.sampling
        defaults = ServerDefaults(not sampling.no_thinking, sampling.preserve_thinking)
        media = None
        if self.settings.vision.enabled:  # media preparation exists only with --vision
            from ninfer.api.media_prompt import build_media_prompts

            media = build_media_prompts(
                self.settings.vision, self.settings.engine.max_context, artifact, tokenizer.encode
            )
        prompts = FrontendPrompts(artifact.chat_template, tokenizer, defaults, media)
        prompts.warm()  # the template compiled before ready, not in the first request
        engine = self.engine = self.engine_factory(self.settings, artifact)  # loads the weights
        engine.start()
        engine.wait_ready()  # readiness includes warm-up and CUDA graph capture
        graphs = engine.graph_stats()
        # CPU or a failed capture: no graphs, no seconds claimed
        capture_s = graphs.capture_s if graphs is not None and graphs.batch_sizes else None
        compile_report = cache.report(compile_s=capture_s)
        pipeline = Pipeline(engine, prompts, self.recorder, self.next_request_id)
        served = ServedModel(
            model_id=self.settings.server.model_id or artifact.model_id,
            max_context=self.settings.engine.max_context,
            efforts=prompts.caps.efforts,
        )
        self.ctx.model_id = served.model_id
        self._server_start(engine, path, artifact, compile_report)
        self.ctx.serve(served, pipeline)
        media_bytes = media.preprocessor.cache if media is not None else None  # live / retained media bytes
        self.reporter = ThroughputReporter(
            engine,
            self.log,
            self.settings.logging.log_stats_interval_ms,
            media_bytes,
            self.recorder.take_compat,
        )
        self.reporter.start()
        self.ready = True
        logger().info("ready: serving %s in %.3fs", self.ctx.model_id, time.monotonic() - t0)

    def _server_start(
        self, eng: EngineView, path: str, artifact: Artifact, compile_report: dict[str, object]
    ) -> None:
        settings, server, engine = self.settings, self.settings.server, self.settings.engine
        cfg = eng.config  # the engine's resolved EngineConfig
        ledger = eng.ledger
        self.log.emit(
            "server_start",
            pid=os.getpid(),
            argv=redact_argv(self.argv, server.api_key_value),
            model_id=self.ctx.model_id,
            artifact={"path": path, "model_id": artifact.model_id, "family": artifact.family},
            engine={
                "max_context": engine.max_context,
                "max_concurrency": engine.max_concurrency,
                "max_pending_requests": engine.max_pending_requests,
                "pending_timeout_ms": engine.pending_timeout_ms,
                "default_max_tokens": engine.default_max_tokens,
                "device": cfg.device,
                "dtype": cfg.dtype,
                "prefill_chunk": cfg.prefill_chunk,
                "prefix_reuse": not cfg.no_prefix_reuse,
                "kv_dtype": cfg.kv_dtype or cfg.dtype,
                "kv_sizing": ledger.as_dict() if ledger is not None else None,
                "speculative": {
                    "method": cfg.spec_method,
                    "draft_tokens": cfg.draft_tokens,
                    "lm_head_draft": cfg.lm_head_draft,
                },
                "cuda_graphs": None if (graphs := eng.graph_stats()) is None else graphs.as_dict(),
                "cold_tier": eng.cold_tier_stats(),
                "compile_cache": compile_report,
                "sampler_presets": {
                    "thinking": _plain(cfg.thinking_preset),
                    "non_thinking": _plain(cfg.non_thinking_preset),
                    "overrides": cfg.sampling,
                },
                "snapshot": eng.snapshot(),
            },
            settings=settings.redacted_dump(),
            thinking_defaults={
                "thinking": not settings.sampling.no_thinking,
                "preserve_thinking": settings.sampling.preserve_thinking,
            },
            python=sys.version.split()[0],
        )
        for line in (
            f"model {self.ctx.model_id} from {path}",
            f"engine max_context={engine.max_context} max_concurrency={engine.max_concurrency} "
            f"max_pending={engine.max_pending_requests} pending_timeout_ms={engine.pending_timeout_ms}",
            f"http {server.host}:{server.port} threads={worker_threads(settings)} "
            f"auth={'on' if server.api_key_value else 'off'} cors={'on' if server.cors else 'off'} "
            f"vision={'on' if settings.vision.enabled else 'off'}",
            f"request log {settings.logging.request_log_jsonl or 'disabled'}; tracing {settings.telemetry.exporter}",
        ):
            logger().info(line)

    def begin_drain(self) -> None:
        """Stop admitting: new generation requests get 503 while in-flight ones finish."""
        if not self.ctx.draining:
            self.ctx.draining = True
            logger().info("draining: no new requests admitted")

    def drain(self) -> None:
        """Stop admitting and drain the engine: in-flight requests finish or are cancelled within
        `drain_timeout_s`. Idempotent; a concurrent caller waits for the first one."""
        with self._drain_lock:
            self.begin_drain()
            if self._drained or self.engine is None:
                return
            t0 = time.monotonic()
            self.engine.shutdown(self.settings.server.drain_timeout_s)
            self._drained = True
            logger().info("engine drained in %.3fs", time.monotonic() - t0)

    def shutdown(self) -> None:
        """Drain, wait for the HTTP threads to release their last responses, then write the final
        throughput interval and close the log (called once the worker stopped serving)."""
        self.drain()
        with self._drain_lock:
            if self._closed:
                return
            self._closed = True
            deadline = time.monotonic() + RELEASE_WAIT_S
            tickets = self.engine.tickets if self.engine is not None else None
            while tickets is not None and tickets.live and time.monotonic() < deadline:
                time.sleep(0.01)
            if self.reporter is not None:
                self.reporter.stop()
            self.tracing.shutdown()
            self.log.close()


def _plain(mapping: Any) -> dict[str, Any] | None:
    return None if mapping is None else dict(mapping)
