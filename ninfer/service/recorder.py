"""The pipeline observer: request-log events, rounded console summaries and trace spans."""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import asdict
from typing import Any

from ninfer.api.errors import ApiError
from ninfer.api.events import GenerationJob
from ninfer.api.ports import Prepared
from ninfer.engine.types import GenerationRequest, RequestStats
from ninfer.service.console import logger
from ninfer.service.metrics import ServiceMetrics
from ninfer.service.request_log import RequestLog
from ninfer.service.telemetry import Tracing

# The request_done speculative object of a request decoded without a speculative backend.
SPECULATIVE_OFF: dict[str, Any] = {
    "backend": "none",
    "draft_window": 0,
    "rounds": 0,
    "drafted_tokens": 0,
    "accepted_tokens": 0,
    "fallback_steps": 0,
    "accepted_per_position": [],
}


COLD_TIER_COUNTS = ("parks", "restores", "evictions", "park_failures", "restore_failures", "entries")
GIB = 1 << 30


def cold_tier_fields(stats: RequestStats) -> dict[str, Any]:
    """request_done's cold-tier fields: the tier's cumulative counters and arena occupancy when the
    request ended (zeros and inactive without a tier), and whether this request was restored."""
    ct: dict[str, Any] = dict(stats.cold_tier)
    out: dict[str, Any] = {
        "cold_tier_active": bool(ct),
        "cold_tier_restored": bool(ct.get("restored", False)),
    }
    for key in COLD_TIER_COUNTS:
        out[f"cold_tier_{key}"] = int(ct.get(key, 0))
    out["cold_tier_capacity_bytes"] = int(ct.get("capacity_bytes", 0))
    out["cold_tier_used_bytes"] = int(ct.get("used_bytes", 0))
    out["cold_tier_arenas"] = list(ct.get("arenas", []))
    return out


def cold_tier_suffix(fields: dict[str, Any]) -> str:
    """The request-done console suffix while the tier is active (cumulative counters)."""
    if not fields["cold_tier_active"]:
        return ""
    failures = fields["cold_tier_park_failures"] + fields["cold_tier_restore_failures"]
    return (
        f" cold=parks={fields['cold_tier_parks']} restores={fields['cold_tier_restores']} "
        f"failures={failures} entries={fields['cold_tier_entries']} "
        f"evictions={fields['cold_tier_evictions']} used={fields['cold_tier_used_bytes'] / GIB:.2f}GiB"
    )


def phase_seconds(prepare_s: float, stats: RequestStats) -> dict[str, float]:
    """request_done.timings_seconds, unrounded. The engine measures from submission; prepare
    (request entry -> submission) is added so ttft and total run from request entry."""
    first = stats.ttft_s > 0.0  # a first token was produced
    return {
        "prepare": prepare_s,
        "queue": stats.queue_s,
        "ttft": prepare_s + stats.ttft_s if first else 0.0,
        "vision": stats.vision_s,
        "prefill": stats.prefill_s,
        "decode": stats.decode_s,
        "total": prepare_s + stats.total_s,
    }


def _config(
    job: GenerationJob,
    request: GenerationRequest | None,
    prepared: Prepared | None,
    stats: RequestStats | None = None,
) -> dict[str, Any]:
    params = request.params if request is not None else job.params
    return {
        "protocol": job.protocol,
        "stream": job.stream,
        # the engine's resolved entitlement once submitted; the request's own value before
        "max_tokens": stats.max_tokens if stats is not None else params.max_tokens,
        "requested_sampling": {
            k: v for k, v in asdict(params).items() if k not in ("stop", "stop_token_ids", "max_tokens")
        },
        "stop_strings": len(params.stop),
        "thinking": prepared.thinking if prepared else None,
        "preserve_thinking": prepared.preserve_thinking if prepared else None,
        "reasoning_effort": prepared.effort if prepared else None,
    }


_INDEX = re.compile(r"\[\d+\]")


def compat_key(adjustment: dict[str, str]) -> str:
    """The counting key of one adjustment: its action and field, array indexes dropped."""
    return f"{adjustment['action']}:{_INDEX.sub('[]', adjustment['param'])}"


def adjustments(job: GenerationJob) -> list[dict[str, str]]:
    """The job's --client-compat record (empty unless a protocol parser adjusted the request)."""
    return list(job.compat)


class Recorder:
    """Implements `ninfer.api.ports.Observer` for the service."""

    def __init__(self, log: RequestLog, tracing: Tracing, metrics: ServiceMetrics | None = None) -> None:
        self.log = log
        self.tracing = tracing
        self.metrics = metrics
        self._lock = threading.Lock()
        self._configs: dict[int, dict[str, Any]] = {}
        self.counts = {"started": 0, "rejected": 0, "done": 0, "error": 0}
        self._compat: Counter[str] = Counter()  # adjustments since the last throughput interval

    def _count_compat(self, job: GenerationJob) -> None:
        if adjustments(job):
            with self._lock:
                self._compat.update(compat_key(a) for a in adjustments(job))

    def take_compat(self) -> dict[str, int]:
        """The --client-compat adjustments counted since the last call (by action and field)."""
        with self._lock:
            out, self._compat = dict(self._compat), Counter()
        return out

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def rejected(self, request_id: int, job: GenerationJob, error: ApiError, prepare_s: float) -> None:
        self._count("rejected")
        self._count_compat(job)
        if self.metrics is not None:
            self.metrics.observe_error(error.status, error.code)
        self.log.emit(
            "request_rejected",
            request_id=request_id,
            client_request_id=job.client_request_id,
            protocol=job.protocol,
            phase="prepare",
            shape=job.shape,
            compat_adjustments=adjustments(job),
            media_items=job.shape.get("media_items", 0),
            prepare_seconds=prepare_s,
            http=error.describe(),
        )
        logger().info("request %d rejected: %d %s", request_id, error.status, error.code)

    def started(
        self,
        request_id: int,
        job: GenerationJob,
        prepared: Prepared,
        request: GenerationRequest,
        stats: RequestStats,
    ) -> None:
        self._count("started")
        self._count_compat(job)
        config = _config(job, request, prepared, stats)
        with self._lock:
            self._configs[request_id] = config
        self.log.emit(
            "request_start",
            request_id=request_id,
            client_request_id=job.client_request_id,
            shape=job.shape,
            compat_adjustments=adjustments(job),
            prompt_tokens=len(prepared.token_ids),
            media_items=prepared.media_items,
            media=prepared.media_log,
            resolved_sampling=stats.resolved_sampling,
            seed=stats.seed,
            **config,
        )
        self.tracing.request_started(request_id, job, prepared, stats.max_tokens)

    def done(self, request_id: int, job: GenerationJob, summary: dict[str, Any], stats: RequestStats) -> None:
        self._count("done")
        with self._lock:
            self._configs.pop(request_id, None)
        timings = phase_seconds(summary["prepare_s"], stats)
        cold = cold_tier_fields(stats)
        if self.metrics is not None:
            self.metrics.observe_done(summary["finish_reason"], summary["completion_tokens"], timings, stats)
        self.log.emit(
            "request_done",
            request_id=request_id,
            client_request_id=job.client_request_id,
            protocol=job.protocol,
            finish_reason=summary["finish_reason"],
            prompt_tokens=summary["prompt_tokens"],
            completion_tokens=summary["completion_tokens"],
            reasoning_tokens=summary["reasoning_tokens"],
            tool_calls=summary["tool_calls"],
            cached_tokens=stats.cached_tokens,
            computed_prefill_tokens=stats.computed_prefill_tokens,
            prefix_reuse_path=stats.reuse_path,
            resolved_sampling=stats.resolved_sampling,
            seed=stats.seed,
            timings_seconds=timings,
            speculative={**SPECULATIVE_OFF, **stats.speculative},
            compilations=stats.compilations,
            compat_adjustments=adjustments(job),
            **cold,
        )
        logger().info(
            "request %d done: %s prompt=%d cache=%d completion=%d ttft=%.3fs total=%.3fs%s",
            request_id,
            summary["finish_reason"],
            summary["prompt_tokens"],
            stats.cached_tokens,
            summary["completion_tokens"],
            timings["ttft"],
            timings["total"],
            cold_tier_suffix(cold),
        )
        self.tracing.request_finished(request_id, summary, stats, None)

    def failed(
        self, request_id: int, job: GenerationJob, error: ApiError, stats: RequestStats | None
    ) -> None:
        self._count("error")
        if self.metrics is not None:
            self.metrics.observe_error(error.status, error.code)
        with self._lock:
            config = self._configs.pop(request_id, None) or _config(job, None, None)
        self.log.emit(
            "request_error",
            request_id=request_id,
            client_request_id=job.client_request_id,
            config=config,
            compat_adjustments=adjustments(job),
            message=error.message,
            http=error.describe(),
            completion_tokens=stats.completion_tokens if stats else 0,
        )
        logger().warning("request %d failed: %s", request_id, error.message)
        self.tracing.request_finished(request_id, None, stats, error)
