"""Frozen settings models, one per Hydra group, each overridable through NINFER_<GROUP>_<KEY>."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, JsonValue, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ninfer.config.errors import ConfigError
from ninfer.engine.config import (
    COLD_TIER_HOST_SHARE,
    DFLASH_MAX_DRAFT,
    MAX_CONCURRENCY,
    MTP_MAX_DRAFT,
    EngineConfig,
)

MAX_SEED = 2**63 - 1
_ENGINE = EngineConfig()  # the settings' bounds and defaults are the engine's, written once there


def _not_bool(value: Any) -> Any:
    # lax pydantic turns true into 1; a switch given to a numeric key is a mistake, not a number
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    return value


Int = Annotated[int, BeforeValidator(_not_bool)]
Float = Annotated[float, BeforeValidator(_not_bool)]


def cli(
    *, metavar: str | None = None, shown: str | None = None, valid: str | None = None
) -> dict[str, JsonValue]:
    """`json_schema_extra` of a setting: the flag's metavar where the type does not say it, the
    default as the contract words it where that is not the value itself, and the valid range as
    an error message words it. A field with a `description` is a `ninfer-serve` flag
    (config/options.py builds the flag table from the fields)."""
    extra = {"metavar": metavar, "shown_default": shown, "valid": valid}
    return {k: v for k, v in extra.items() if v}


def _config(group: str) -> SettingsConfigDict:
    return SettingsConfigDict(frozen=True, env_prefix=f"NINFER_{group.upper()}_", extra="forbid")


class ModelSettings(BaseSettings):
    """Which artifact is served."""

    model_config = _config("model")

    artifact: str | None = Field(None, min_length=1)  # path of the .ninfer artifact; None = demo


class EngineSettings(BaseSettings):
    """The resident engine: context ceiling, admission, prefill, device and precision."""

    model_config = _config("engine")

    max_context: Int = Field(
        _ENGINE.max_context, ge=1, description="logical context ceiling of each sequence"
    )
    max_concurrency: Int = Field(
        _ENGINE.max_concurrency,
        ge=1,
        le=MAX_CONCURRENCY,
        description="maximum admitted requests; valid range 1..8",
    )
    max_pending_requests: Int = Field(
        _ENGINE.max_pending, ge=0, description="additional requests allowed to wait for admission"
    )
    pending_timeout_ms: Int = Field(
        _ENGINE.pending_timeout_ms, ge=1, description="maximum preparation-plus-admission wait"
    )
    prefill_chunk: Int = Field(_ENGINE.prefill_chunk, ge=1, description="text-prefill chunk")
    device: Annotated[int, Field(ge=0), BeforeValidator(_not_bool)] | Literal["cpu"] = Field(
        0,
        description="CUDA device index (or cpu; the CPU is used when CUDA is absent)",
        json_schema_extra=cli(metavar="N", valid="must be a CUDA device index >= 0 or cpu"),
    )
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="weight and activation dtype",
        json_schema_extra=cli(shown="auto (bf16 GPU, fp32 CPU)"),
    )
    # kernel backend: auto = the fastest that imports (triton on CUDA, else reference)
    kernel_backend: Literal["auto", "reference", "triton", "xformers", "tensorrt"] = "auto"
    no_cuda_graph: bool = Field(
        False, description="disable CUDA Graph decode graphs", json_schema_extra=cli(shown="on")
    )
    no_prefix_reuse: bool = Field(
        False, description="disable compatible-prefix caching", json_schema_extra=cli(shown="prefix reuse on")
    )
    default_max_tokens: Int = Field(
        _ENGINE.default_max_tokens, ge=1, description="output limit when omitted by a request"
    )

    def torch_device(self, cuda_available: bool) -> str:
        """``cuda:N``, or ``cpu`` when asked for or when CUDA is absent."""
        return "cpu" if self.device == "cpu" or not cuda_available else f"cuda:{self.device}"

    def torch_dtype(self, on_gpu: bool) -> str:
        """The weight / activation dtype name: auto is bfloat16 on a GPU and float32 on the CPU."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if on_gpu else "float32"


class KVSettings(BaseSettings):
    """The shared Main Text KV pool."""

    model_config = _config("kv")

    # tokens; None follows engine.max_context, "auto" maximizes it from free GPU memory
    capacity: Annotated[int, Field(ge=1), BeforeValidator(_not_bool)] | Literal["auto"] | None = Field(
        None,
        description="explicit shared Main Text KV capacity, or maximize it from remaining GPU memory; omitted means --max-context",
        json_schema_extra=cli(metavar="N|auto", shown="8192", valid="must be an integer >= 1, auto or null"),
    )
    dtype: Literal["bf16", "int8"] = Field("bf16", description="KV-cache storage")


class SpecSettings(BaseSettings):
    """Speculative decoding, frozen at startup."""

    model_config = _config("spec")

    method: Literal["mtp", "dflash"] | None = Field(
        None, description="speculative backend", json_schema_extra=cli(shown="off")
    )
    draft_tokens: Int | None = Field(None, ge=1, le=DFLASH_MAX_DRAFT, description="MTP 1..5; DFlash 1..15")
    lm_head_draft: bool = Field(False, description="optimized proposal head")

    @model_validator(mode="after")
    def _rules(self) -> SpecSettings:
        if self.method is None:
            if self.draft_tokens is not None:
                raise ConfigError.for_key(
                    "spec.draft_tokens", self.draft_tokens, "requires spec.method (--spec mtp|dflash)"
                )
            if self.lm_head_draft:
                raise ConfigError.for_key(
                    "spec.lm_head_draft", True, "requires spec.method (--spec mtp|dflash)"
                )
        elif self.method == "dflash" and self.lm_head_draft:
            raise ConfigError.for_key(
                "spec.lm_head_draft", True, "applies to spec.method=mtp only (drop it with --spec dflash)"
            )
        elif self.method == "mtp" and self.draft_tokens is not None and self.draft_tokens > MTP_MAX_DRAFT:
            raise ConfigError.for_key(
                "spec.draft_tokens",
                self.draft_tokens,
                f"must be an integer in 1..{MTP_MAX_DRAFT} with spec.method=mtp",
            )
        return self


class VisionSettings(BaseSettings):
    """Image and video input and the prepared-media budgets."""

    model_config = _config("vision")

    enabled: bool = Field(False, description="enable media input and load Vision GPU allocations")
    media_cache_mib: Int = Field(
        1024, ge=0, description="LRU-retained prepared BF16 media payloads; 0 disables retention"
    )
    media_live_mib: Int = Field(2048, ge=1, description="all live prepared BF16 media payloads")
    media_preprocess_threads: Int = Field(
        0, ge=0, description="bounded media preprocessing workers; 0 selects at most 16 from host concurrency"
    )
    # media URLs may name loopback / private / link-local hosts (off: such URLs are refused)
    allow_private_media_urls: bool = False
    media_max_fetch_mib: Int = Field(64, ge=1)  # one acquired media item
    media_fetch_timeout_s: float = Field(30.0, gt=0)  # one HTTP(S) acquisition, redirects included


class ColdTierSettings(BaseSettings):
    """The cold tier for evicted retained prefixes: arenas on secondary GPUs and / or in host RAM."""

    model_config = _config("cold_tier")

    enabled: bool = Field(
        _ENGINE.cold_tier,
        description="disable the cold tier (secondary GPUs and host memory)",
        json_schema_extra=cli(shown="cold tier on"),
    )
    device: Int = Field(
        _ENGINE.cold_tier_device,
        ge=-1,
        description="pin the cold tier to one secondary device; -1 spans every non-primary device with at least 512 MiB free",
    )
    capacity_mib: Int = Field(
        _ENGINE.cold_tier_capacity_mib,
        ge=0,
        description="per-device cold-tier arena bytes; 0 sizes each arena from device free memory minus 256 MiB",
    )
    staging_mib: Int = Field(
        _ENGINE.cold_tier_staging_mib, ge=1, description="pinned host staging buffer for cold-tier transfers"
    )
    host_mib: Int | None = Field(
        _ENGINE.cold_tier_host_mib,
        ge=0,
        description="pinned host-RAM cold-tier arena (beside any secondary-GPU arenas); 0 disables it",
        json_schema_extra=cli(
            shown=f"{COLD_TIER_HOST_SHARE:.0%} of free host memory without a secondary GPU"
        ),
    )


class ServerSettings(BaseSettings):
    """The HTTP listener, authentication, body limit and local Responses store."""

    model_config = _config("server")

    host: str = Field(
        "127.0.0.1", min_length=1, description="listen address", json_schema_extra=cli(metavar="H")
    )
    port: Int = Field(8080, ge=1, le=65535, description="listen port")
    api_key: SecretStr | None = Field(
        None,
        min_length=1,
        description="required bearer or x-api-key value",
        json_schema_extra=cli(metavar="KEY"),
    )
    model_id: str | None = Field(
        None,
        min_length=1,
        description="override the public OpenAI model alias",
        json_schema_extra=cli(metavar="ID", shown="artifact identity.model_id"),
    )
    cors: bool = Field(False, description="permissive browser CORS headers")
    client_compat: bool = Field(  # api/compat.py
        False,
        description="accept, ignore or map the extra fields real clients send (recorded per request)",
    )
    max_request_mib: Int = Field(384, ge=1, description="body-size limit before JSON parsing")
    response_store_max_records: Int = Field(
        1024, ge=1, description="maximum locally retained Responses objects"
    )
    response_store_max_mib: Int = Field(
        256, ge=1, description="total local Response envelope/Item/context budget"
    )
    drain_timeout_s: Float = Field(30.0, ge=0.0, allow_inf_nan=False)  # graceful-shutdown wait
    metrics_open: bool = Field(  # for a scraper on a private network
        False,
        description="serve GET /metrics without the API key",
        json_schema_extra=cli(shown="follows --api-key"),
    )
    # a started request's head must arrive within header_timeout_s, its body within body_timeout_s
    # after the head (else 408); an idle connection is closed after keepalive_s
    header_timeout_s: Float = Field(10.0, gt=0.0, le=3600.0, allow_inf_nan=False)
    body_timeout_s: Float = Field(60.0, gt=0.0, le=3600.0, allow_inf_nan=False)
    keepalive_s: Int = Field(5, ge=1, le=3600)

    @property
    def api_key_value(self) -> str | None:
        """The API key's value (None: no authentication)."""
        return self.api_key.get_secret_value() or None if self.api_key is not None else None

    @property
    def max_request_bytes(self) -> int:
        return self.max_request_mib * 1024 * 1024


class SamplingSettings(BaseSettings):
    """Process-level sampler overrides (None keeps the model's registered value) and thinking defaults."""

    model_config = _config("sampling")

    temperature: Float | None = Field(
        None, ge=0.0, le=2.0, allow_inf_nan=False, description="process-level temperature override"
    )
    top_p: Float | None = Field(
        None, ge=0.0, le=1.0, allow_inf_nan=False, description="process-level top-p override"
    )
    top_k: Int | None = Field(None, ge=0, description="process-level top-k override")  # 0 = no cut
    min_p: Float | None = Field(
        None, ge=0.0, le=1.0, allow_inf_nan=False, description="process-level min-p override"
    )
    presence_penalty: Float | None = Field(
        None, ge=-2.0, le=2.0, allow_inf_nan=False, description="process-level presence-penalty override"
    )
    frequency_penalty: Float | None = Field(
        None, ge=-2.0, le=2.0, allow_inf_nan=False, description="process-level frequency-penalty override"
    )
    seed: Int | None = Field(
        None,
        ge=0,
        le=MAX_SEED,
        description="fixed seed when a request omits one",
        json_schema_extra=cli(shown="fresh random seed per request"),
    )
    greedy: bool = Field(False, description="force exact argmax for all requests")
    no_thinking: bool = Field(
        False, description="disable thinking by default", json_schema_extra=cli(shown="thinking on")
    )
    preserve_thinking: bool = Field(False, description="preserve closed-turn assistant reasoning by default")
    default_thinking_budget: Int | None = Field(
        None,
        ge=1,
        description="reasoning tokens a thinking request may use when it sets no budget of its own",
        json_schema_extra=cli(shown="unlimited"),
    )


class LoggingSettings(BaseSettings):
    """Console level, the structured request log and the throughput report."""

    model_config = _config("logging")

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", description="console log level", json_schema_extra=cli(metavar="LEVEL")
    )
    request_log_jsonl: str | None = Field(
        None,
        min_length=1,
        description="append full-precision server/request records",
        json_schema_extra=cli(metavar="FILE", shown="disabled"),
    )
    log_stats_interval_ms: Int = Field(
        5000, ge=0, description="aggregate throughput report interval; 0 disables it"
    )


class TelemetrySettings(BaseSettings):
    """OpenTelemetry tracing."""

    model_config = _config("telemetry")

    exporter: Literal["none", "console", "otlp"] = "none"
    otlp_endpoint: str | None = Field(None, min_length=1)  # None = the exporter's default endpoint
    service_name: str = Field("ninfer", min_length=1)


def defaults(model: type[BaseSettings]) -> dict[str, Any]:
    """A settings group's default values by field name (the one place defaults are read)."""
    return {name: info.default for name, info in model.model_fields.items()}


GROUPS: dict[str, type[BaseSettings]] = {
    "model": ModelSettings,
    "engine": EngineSettings,
    "kv": KVSettings,
    "spec": SpecSettings,
    "vision": VisionSettings,
    "cold_tier": ColdTierSettings,
    "server": ServerSettings,
    "sampling": SamplingSettings,
    "logging": LoggingSettings,
    "telemetry": TelemetrySettings,
}
