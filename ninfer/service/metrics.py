"""Prometheus metrics: per-request histograms and counters, and scheduler gauges read at scrape.

Every series has a `ninfer_*` name; where vLLM exports a series with the same meaning, it is also
exported under vLLM's name (`vllm:*`, label `model_name`), so routers (the Gateway API Inference
Extension endpoint picker, vLLM production-stack), autoscalers and dashboards built for vLLM read
NInfer unchanged. `docs/metrics.md` maps each series to its meaning and its peers' names.

Every series exists from the first scrape, at zero (as vLLM exports them): the histograms, the
token counters and the finish-reason and reuse-path counters get their children for the current
model name at each scrape, before any request has finished.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ninfer.engine.speculative import counters as spec_counters
from ninfer.engine.types import RequestStats, ReusePath
from ninfer.service.engine_view import EngineView

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Buckets as vLLM's (seconds), so dashboards' quantiles line up across servers.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
# the pipeline's finish reasons of a finished request (`request_done`)
FINISH_REASONS = ("stop", "length", "tool_calls", "cancelled")
COLD_TIER_GAUGES = ("entries", "capacity_bytes", "used_bytes")
COLD_TIER_COUNTERS = ("parks", "restores", "evictions", "park_failures", "restore_failures")

# (ninfer name, vLLM alias or None, help): per-request histograms in seconds
HISTOGRAMS = (
    ("ninfer_time_to_first_token_seconds", "vllm:time_to_first_token_seconds",
     "Request entry to first token", TTFT_BUCKETS),
    ("ninfer_inter_token_latency_seconds", "vllm:inter_token_latency_seconds",
     "Time between output tokens (each request's mean gap, once per gap)", ITL_BUCKETS),
    ("ninfer_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds",
     "Request entry to last token", E2E_BUCKETS),
    ("ninfer_request_queue_time_seconds", "vllm:request_queue_time_seconds",
     "Submission to admission (waiting for a lane)", E2E_BUCKETS),
)  # fmt: skip
# (ninfer name, vLLM alias or None, help): token counters (prometheus_client adds `_total`)
COUNTERS = (
    ("ninfer_prompt_tokens", "vllm:prompt_tokens", "Prompt tokens of finished requests"),
    ("ninfer_generation_tokens", "vllm:generation_tokens", "Generated tokens of finished requests"),
    ("ninfer_prefix_cache_queries", "vllm:prefix_cache_queries",
     "Prompt tokens looked up in the prefix cache"),
    ("ninfer_prefix_cache_hits", "vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache"),
    ("ninfer_spec_decode_num_draft_tokens", "vllm:spec_decode_num_draft_tokens",
     "Speculative tokens drafted"),
    ("ninfer_spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens",
     "Speculative tokens accepted"),
)  # fmt: skip


class ServiceMetrics:
    """Owns one registry (never the process-global one). `observe_*` are called by the recorder;
    the scheduler gauges are read from `engine()` at each scrape (None while loading)."""

    def __init__(self, model_name: Callable[[], str | None], engine: Callable[[], EngineView | None]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model_name = model_name
        self._engine = engine
        self._hist: dict[str, list[Histogram]] = {}
        for name, alias, doc, buckets in HISTOGRAMS:
            self._hist[name] = [
                Histogram(n, doc, ["model_name"], buckets=buckets, registry=self.registry)
                for n in (name, alias)
            ]
        self._count: dict[str, list[Counter]] = {}
        for name, alias, doc in COUNTERS:
            self._count[name] = [
                Counter(n, doc, ["model_name"], registry=self.registry) for n in (name, alias)
            ]
        reg = self.registry
        self._success = [
            Counter("ninfer_request_success", "Finished requests by finish reason",
                    ["model_name", "finished_reason"], registry=reg),
            Counter("vllm:request_success", "Finished requests by finish reason",
                    ["model_name", "finished_reason"], registry=reg),
        ]  # fmt: skip
        self._errors = Counter(
            "ninfer_request_errors", "Requests that failed or were refused, by HTTP status and code",
            ["model_name", "status", "code"], registry=reg,
        )  # fmt: skip
        self._reuse = Counter(
            "ninfer_prefix_reuse_path", "Admitted requests by prefix reuse path",
            ["model_name", "path"], registry=reg,
        )  # fmt: skip
        self._http = Counter(
            "ninfer_http_requests", "HTTP responses by route template, method and status",
            ["model_name", "route", "method", "status"], registry=reg,
        )  # fmt: skip
        self.registry.register(_SchedulerCollector(self._label, engine))
        self._shown: str | None = None  # the model name whose zero children exist
        self._lock = threading.Lock()  # scrapes run on several server threads

    def _materialize(self, label: str) -> None:
        """The fixed children of `label` at zero (the loading placeholder's go once the model's
        name is known: nothing finishes while loading, so they hold nothing)."""
        with self._lock:
            if label != self._shown:
                self._materialize_locked(label)

    def _materialize_locked(self, label: str) -> None:
        fixed: list[tuple[Histogram | Counter, tuple[str, ...]]] = []
        fixed += [(h, ()) for hists in self._hist.values() for h in hists]
        fixed += [(c, ()) for counts in self._count.values() for c in counts]
        fixed += [(c, (reason,)) for c in self._success for reason in FINISH_REASONS]
        fixed += [(self._reuse, (path,)) for path in get_args(ReusePath)]
        for metric, extra in fixed:
            if self._shown == "":  # the loading placeholder (a real name is never replaced)
                metric.remove(self._shown, *extra)
            metric.labels(label, *extra)
        self._shown = label

    def _label(self) -> str:
        return self._model_name() or ""

    def _inc(self, name: str, value: float) -> None:
        if value > 0:
            for c in self._count[name]:
                c.labels(self._label()).inc(value)

    def _observe(self, name: str, value: float, times: int = 1) -> None:
        for h in self._hist[name]:
            child = h.labels(self._label())
            for _ in range(times):
                child.observe(value)

    def observe_done(
        self, finish_reason: str, completion_tokens: int, timings: dict[str, float], stats: RequestStats
    ) -> None:
        """One finished request: latencies, tokens, prefix-cache hits, reuse path, speculation."""
        label = self._label()
        if timings["ttft"] > 0.0:
            self._observe("ninfer_time_to_first_token_seconds", timings["ttft"])
        gaps = completion_tokens - 1
        if gaps > 0 and timings["decode"] > 0.0:
            self._observe("ninfer_inter_token_latency_seconds", timings["decode"] / gaps, min(gaps, 4096))
        self._observe("ninfer_e2e_request_latency_seconds", timings["total"])
        self._observe("ninfer_request_queue_time_seconds", timings["queue"])
        self._inc("ninfer_prompt_tokens", stats.prompt_tokens)
        self._inc("ninfer_generation_tokens", completion_tokens)
        self._inc("ninfer_prefix_cache_queries", stats.prompt_tokens)
        self._inc("ninfer_prefix_cache_hits", stats.cached_tokens)
        spec = stats.speculative
        self._inc("ninfer_spec_decode_num_draft_tokens", spec_counters.count(spec, "drafted_tokens"))
        self._inc("ninfer_spec_decode_num_accepted_tokens", spec_counters.count(spec, "accepted_tokens"))
        for c in self._success:
            c.labels(label, finish_reason).inc()
        self._reuse.labels(label, str(stats.reuse_path)).inc()

    def observe_error(self, status: int, code: str) -> None:
        self._errors.labels(self._label(), str(status), code).inc()

    def observe_http(self, route: str, method: str, status: int) -> None:
        """One HTTP response (every route and outcome; a mid-stream failure keeps its 200)."""
        self._http.labels(self._label(), route, method, str(status)).inc()

    def render(self) -> bytes:
        self._materialize(self._label())
        return generate_latest(self.registry)


class _SchedulerCollector(Collector):
    """Gauges from the engine's scheduler snapshot and cold tier, computed at each scrape."""

    def __init__(self, label: Callable[[], str], engine: Callable[[], EngineView | None]) -> None:
        self._label = label
        self._engine = engine

    def describe(self) -> list[Metric]:
        return []  # dynamic: read at collect time only

    def collect(self) -> Iterator[Metric]:
        label = self._label()
        engine = self._engine()
        snap = engine.snapshot() if engine is not None else None
        running = snap.running if snap is not None else 0
        waiting = snap.waiting if snap is not None else 0
        total = snap.total_pages if snap is not None else 0
        free = snap.free_pages if snap is not None else 0
        retained = snap.resident_pages if snap is not None else 0
        held = max(0, total - free - retained)  # pages of active requests
        usage = held / total if total else 0.0
        live = engine.tickets.live if engine is not None else 0

        def gauge(
            name: str, doc: str, value: float, extra: dict[str, str] | None = None
        ) -> GaugeMetricFamily:
            keys = ["model_name", *(extra or {})]
            g = GaugeMetricFamily(name, doc, labels=keys)
            g.add_metric([label, *(extra or {}).values()], value)
            return g

        for prefix, sep in (("ninfer", "_"), ("vllm", ":")):
            yield gauge(
                f"{prefix}{sep}num_requests_running", "Requests holding a lane (prefill or decode)", running
            )
            yield gauge(
                f"{prefix}{sep}num_requests_waiting", "Requests submitted and not yet admitted", waiting
            )
            yield gauge(
                f"{prefix}{sep}kv_cache_usage_perc", "KV pages held by active requests / all (0..1)", usage
            )
        # vLLM < 0.9 name of the same gauge, still read by the GIE endpoint picker's vLLM defaults
        yield gauge("vllm:gpu_cache_usage_perc", "KV pages held by active requests / all (0..1)", usage)
        yield gauge(
            "ninfer_kv_cache_retained_perc",
            "KV pages retained by idle lanes for prefix reuse (reclaimable) / all (0..1)",
            retained / total if total else 0.0,
        )
        yield gauge("ninfer_kv_cache_pages_total", "KV pages in the pool", total)
        yield gauge("ninfer_live_tickets", "Requests alive (running + waiting + releasing)", live)
        yield gauge(
            "ninfer_ready", "1 once the engine is loaded and serving", 1.0 if engine is not None else 0.0
        )
        stats = (engine.cold_tier_stats() if engine is not None else None) or {}
        yield gauge(
            "ninfer_cold_tier_active",
            "1 when the cold tier (secondary GPUs or host memory) is on",
            1.0 if stats else 0.0,
        )
        for key in COLD_TIER_GAUGES:
            yield gauge(
                f"ninfer_cold_tier_{key}", f"Cold tier {key.replace('_', ' ')}", float(stats.get(key, 0))
            )
        for key in COLD_TIER_COUNTERS:  # the tier's own cumulative counters
            c = CounterMetricFamily(
                f"ninfer_cold_tier_{key}", f"Cold tier {key.replace('_', ' ')}", labels=["model_name"]
            )
            c.add_metric([label], float(stats.get(key, 0)))
            yield c
