"""The ninfer-serve flag <-> settings key table, Hydra override quoting and argv redaction.

One row per server option of the serving contract, in its order. ``ninfer-serve --help`` and
the flag translation are generated from these rows, so the flags and the keys cannot drift:

    flag                           key
    --host H                       server.host
    --port N                       server.port
    --api-key KEY                  server.api_key
    --model-id ID                  server.model_id
    --max-context N                engine.max_context
    --kv-capacity N|auto           kv.capacity
    --max-concurrency N            engine.max_concurrency
    --max-pending-requests N       engine.max_pending_requests
    --pending-timeout-ms N         engine.pending_timeout_ms
    --prefill-chunk N              engine.prefill_chunk
    --log-stats-interval-ms N      logging.log_stats_interval_ms
    --device N|cpu                 engine.device
    --max-request-mib N            server.max_request_mib
    --media-cache-mib N            vision.media_cache_mib
    --media-live-mib N             vision.media_live_mib
    --media-preprocess-threads N   vision.media_preprocess_threads
    --request-log-jsonl FILE       logging.request_log_jsonl
    --response-store-max-records N server.response_store_max_records
    --response-store-max-mib N     server.response_store_max_mib
    --kv-dtype bf16|int8           kv.dtype
    --spec mtp|dflash              spec.method
    --draft-tokens N               spec.draft_tokens
    --lm-head-draft                spec.lm_head_draft=true
    --default-max-tokens N         engine.default_max_tokens
    --vision                       vision.enabled=true
    --no-cuda-graph                engine.no_cuda_graph=true
    --no-prefix-reuse              engine.no_prefix_reuse=true
    --cold-tier-device N           cold_tier.device
    --cold-tier-capacity-mib N     cold_tier.capacity_mib
    --cold-tier-staging-mib N      cold_tier.staging_mib
    --no-cold-tier                 cold_tier.enabled=false
    --no-thinking                  sampling.no_thinking=true
    --preserve-thinking            sampling.preserve_thinking=true
    --cors                         server.cors=true
    --temperature F ... --seed N   sampling.<name>
    --greedy                       sampling.greedy=true

Beyond the contract: ``--dtype`` (engine.dtype), ``--log-level`` (logging.level),
``--client-compat`` (server.client_compat=true) and ``--metrics-open`` (server.metrics_open).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ninfer.config.errors import REDACTED


@dataclass(frozen=True)
class Option:
    """One command-line flag and the settings key it sets."""

    flag: str  # e.g. "--max-context"
    key: str  # e.g. "engine.max_context"
    meaning: str
    default: str  # the default as the contract states it
    metavar: str | None = None  # None: a switch without a value
    switch_value: bool = True  # the value a switch writes to its key

    @property
    def is_switch(self) -> bool:
        return self.metavar is None

    def override(self, value: str | None = None) -> str:
        """The Hydra override this flag stands for (``value`` is the flag's argument)."""
        if self.is_switch:
            return f"{self.key}={'true' if self.switch_value else 'false'}"
        assert value is not None
        return f"{self.key}={hydra_quote(value)}"


def _v(flag: str, metavar: str, key: str, meaning: str, default: str) -> Option:
    return Option(flag, key, meaning, default, metavar)


def _s(flag: str, key: str, meaning: str, default: str, value: bool = True) -> Option:
    return Option(flag, key, meaning, default, None, value)


CONTRACT_OPTIONS: tuple[Option, ...] = (
    _v("--host", "H", "server.host", "listen address", "127.0.0.1"),
    _v("--port", "N", "server.port", "listen port", "8080"),
    _v("--api-key", "KEY", "server.api_key", "required bearer or x-api-key value", "unset"),
    _v(
        "--model-id",
        "ID",
        "server.model_id",
        "override the public OpenAI model alias",
        "artifact identity.model_id",
    ),
    _v("--max-context", "N", "engine.max_context", "logical context ceiling of each sequence", "8192"),
    _v(
        "--kv-capacity",
        "N|auto",
        "kv.capacity",
        "explicit shared Main Text KV capacity, or maximize it from remaining GPU memory; omitted means --max-context",
        "8192",
    ),
    _v(
        "--max-concurrency", "N", "engine.max_concurrency", "maximum admitted requests; valid range 1..8", "1"
    ),
    _v(
        "--max-pending-requests",
        "N",
        "engine.max_pending_requests",
        "additional requests allowed to wait for admission",
        "16",
    ),
    _v(
        "--pending-timeout-ms",
        "N",
        "engine.pending_timeout_ms",
        "maximum preparation-plus-admission wait",
        "30000",
    ),
    _v("--prefill-chunk", "N", "engine.prefill_chunk", "text-prefill chunk", "1024"),
    _v(
        "--log-stats-interval-ms",
        "N",
        "logging.log_stats_interval_ms",
        "aggregate throughput report interval; 0 disables it",
        "5000",
    ),
    _v(
        "--device",
        "N",
        "engine.device",
        "CUDA device index (or cpu; the CPU is used when CUDA is absent)",
        "0",
    ),
    _v("--max-request-mib", "N", "server.max_request_mib", "body-size limit before JSON parsing", "384"),
    _v(
        "--media-cache-mib",
        "N",
        "vision.media_cache_mib",
        "LRU-retained prepared BF16 media payloads; 0 disables retention",
        "1024",
    ),
    _v("--media-live-mib", "N", "vision.media_live_mib", "all live prepared BF16 media payloads", "2048"),
    _v(
        "--media-preprocess-threads",
        "N",
        "vision.media_preprocess_threads",
        "bounded media preprocessing workers; 0 selects at most 16 from host concurrency",
        "0",
    ),
    _v(
        "--request-log-jsonl",
        "FILE",
        "logging.request_log_jsonl",
        "append full-precision server/request records",
        "disabled",
    ),
    _v(
        "--response-store-max-records",
        "N",
        "server.response_store_max_records",
        "maximum locally retained Responses objects",
        "1024",
    ),
    _v(
        "--response-store-max-mib",
        "N",
        "server.response_store_max_mib",
        "total local Response envelope/Item/context budget",
        "256",
    ),
    _v("--kv-dtype", "bf16|int8", "kv.dtype", "KV-cache storage", "bf16"),
    _v("--spec", "mtp|dflash", "spec.method", "speculative backend", "off"),
    _v("--draft-tokens", "N", "spec.draft_tokens", "MTP 1..5; DFlash 1..15", "unset"),
    _s("--lm-head-draft", "spec.lm_head_draft", "optimized proposal head", "off"),
    _v(
        "--default-max-tokens",
        "N",
        "engine.default_max_tokens",
        "output limit when omitted by a request",
        "8192",
    ),
    _s("--vision", "vision.enabled", "enable media input and load Vision GPU allocations", "off"),
    _s("--no-cuda-graph", "engine.no_cuda_graph", "disable CUDA Graph decode graphs", "on"),
    _s("--no-prefix-reuse", "engine.no_prefix_reuse", "disable compatible-prefix caching", "prefix reuse on"),
    _v(
        "--cold-tier-device",
        "N",
        "cold_tier.device",
        "pin the cold tier to one secondary device; -1 spans every non-primary device with at least 512 MiB free",
        "-1",
    ),
    _v(
        "--cold-tier-capacity-mib",
        "N",
        "cold_tier.capacity_mib",
        "per-device cold-tier arena bytes; 0 sizes each arena from device free memory minus 256 MiB",
        "0",
    ),
    _v(
        "--cold-tier-staging-mib",
        "N",
        "cold_tier.staging_mib",
        "pinned host staging buffer for cold-tier transfers",
        "64",
    ),
    _s("--no-cold-tier", "cold_tier.enabled", "disable the cross-GPU cold tier", "cold tier on", value=False),
    _s("--no-thinking", "sampling.no_thinking", "disable thinking by default", "thinking on"),
    _s(
        "--preserve-thinking",
        "sampling.preserve_thinking",
        "preserve closed-turn assistant reasoning by default",
        "off",
    ),
    _s("--cors", "server.cors", "permissive browser CORS headers", "off"),
    _v("--temperature", "F", "sampling.temperature", "process-level temperature override", "unset"),
    _v("--top-p", "F", "sampling.top_p", "process-level top-p override", "unset"),
    _v("--top-k", "N", "sampling.top_k", "process-level top-k override", "unset"),
    _v("--min-p", "F", "sampling.min_p", "process-level min-p override", "unset"),
    _v(
        "--presence-penalty",
        "F",
        "sampling.presence_penalty",
        "process-level presence-penalty override",
        "unset",
    ),
    _v(
        "--frequency-penalty",
        "F",
        "sampling.frequency_penalty",
        "process-level frequency-penalty override",
        "unset",
    ),
    _v(
        "--seed", "N", "sampling.seed", "fixed seed when a request omits one", "fresh random seed per request"
    ),
    _s("--greedy", "sampling.greedy", "force exact argmax for all requests", "off"),
)

EXTRA_OPTIONS: tuple[Option, ...] = (
    _s(
        "--metrics-open", "server.metrics_open", "serve GET /metrics without the API key", "follows --api-key"
    ),
    _v(
        "--dtype",
        "auto|bfloat16|float32",
        "engine.dtype",
        "weight and activation dtype",
        "auto (bf16 GPU, fp32 CPU)",
    ),
    _v("--log-level", "LEVEL", "logging.level", "console log level", "INFO"),
    _s(
        "--client-compat",
        "server.client_compat",
        "accept, ignore or map the extra fields real clients send (recorded per request)",
        "off",
    ),
)

OPTIONS: tuple[Option, ...] = CONTRACT_OPTIONS + EXTRA_OPTIONS
BY_FLAG: dict[str, Option] = {o.flag: o for o in OPTIONS}
BY_KEY: dict[str, Option] = {o.key: o for o in OPTIONS}


def hydra_quote(value: str) -> str:
    """``value`` as a single-quoted Hydra override string that composes back to exactly ``value``.

    Quotes and trailing backslashes are escaped and ``${`` is kept literal (no interpolation), so an
    API key or a path with any characters round-trips.
    """
    text = re.sub(r"(\\*)(\$\{)", lambda m: m.group(1) * 2 + "\\${", value)
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return f"'{text}'"


_SECRET_OVERRIDE = re.compile(r"^(\+{0,2}server\.api_key=)(.*)$", re.DOTALL)


def argv_redacted(argv: Sequence[str]) -> list[str]:
    """``argv`` with every API-key value replaced by ``<redacted>`` (flag and Hydra spellings)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg == "--api-key":
            out.append(arg)
            hide_next = True
        elif arg.startswith("--api-key="):
            out.append("--api-key=" + REDACTED)
        elif arg.startswith("--set=") and _SECRET_OVERRIDE.match(arg[len("--set=") :]):
            out.append("--set=" + _SECRET_OVERRIDE.sub(r"\1", arg[len("--set=") :]) + REDACTED)
        elif _SECRET_OVERRIDE.match(arg):
            out.append(_SECRET_OVERRIDE.sub(r"\1", arg) + REDACTED)
        else:
            out.append(arg)
    return out
