"""Frozen settings models, one per Hydra group, each overridable through NINFER_<GROUP>_<KEY>."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ninfer.config.errors import ConfigError

PAGE_TOKENS = 64  # the KV pool and every sequence are counted in pages of this many tokens
MTP_MAX_DRAFT = 5
DFLASH_MAX_DRAFT = 15
MAX_CONCURRENCY = 8
MAX_SEED = 2**63 - 1


def _not_bool(value: Any) -> Any:
    # lax pydantic turns true into 1; a switch given to a numeric key is a mistake, not a number
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    return value


Int = Annotated[int, BeforeValidator(_not_bool)]
Float = Annotated[float, BeforeValidator(_not_bool)]


def _config(group: str) -> SettingsConfigDict:
    return SettingsConfigDict(frozen=True, env_prefix=f"NINFER_{group.upper()}_", extra="forbid")


class ModelSettings(BaseSettings):
    """Which artifact is served."""

    model_config = _config("model")

    artifact: str | None = Field(None, min_length=1)  # path of the .ninfer artifact; None = demo


class EngineSettings(BaseSettings):
    """The resident engine: context ceiling, admission, prefill, device and precision."""

    model_config = _config("engine")

    max_context: Int = Field(8192, ge=1)
    max_concurrency: Int = Field(1, ge=1, le=MAX_CONCURRENCY)
    max_pending_requests: Int = Field(16, ge=0)
    pending_timeout_ms: Int = Field(30000, ge=1)
    prefill_chunk: Int = Field(1024, ge=1)
    device: Annotated[int, Field(ge=0), BeforeValidator(_not_bool)] | Literal["cpu"] = Field(
        0, json_schema_extra={"valid": "must be a CUDA device index >= 0 or cpu"}
    )
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    # kernel backend: auto = the fastest that imports (triton on CUDA, else reference)
    kernel_backend: Literal["auto", "reference", "triton", "xformers", "tensorrt"] = "auto"
    no_cuda_graph: bool = False
    no_prefix_reuse: bool = False
    default_max_tokens: Int = Field(8192, ge=1)

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
        None, json_schema_extra={"valid": "must be an integer >= 1, auto or null"}
    )
    dtype: Literal["bf16", "int8"] = "bf16"


class SpecSettings(BaseSettings):
    """Speculative decoding, frozen at startup."""

    model_config = _config("spec")

    method: Literal["mtp", "dflash"] | None = None
    draft_tokens: Int | None = Field(None, ge=1, le=DFLASH_MAX_DRAFT)
    lm_head_draft: bool = False

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

    enabled: bool = False
    media_cache_mib: Int = Field(1024, ge=0)
    media_live_mib: Int = Field(2048, ge=1)
    media_preprocess_threads: Int = Field(0, ge=0)
    # media URLs may name loopback / private / link-local hosts (off: such URLs are refused)
    allow_private_media_urls: bool = False
    media_max_fetch_mib: Int = Field(64, ge=1)  # one acquired media item
    media_fetch_timeout_s: float = Field(30.0, gt=0)  # one HTTP(S) acquisition, redirects included


class ColdTierSettings(BaseSettings):
    """The cross-GPU cold tier for evicted retained prefixes."""

    model_config = _config("cold_tier")

    enabled: bool = True
    device: Int = Field(-1, ge=-1)  # -1 spans every non-primary device with >= 512 MiB free
    capacity_mib: Int = Field(0, ge=0)  # 0 sizes each arena from free memory minus 256 MiB
    staging_mib: Int = Field(64, ge=1)


class ServerSettings(BaseSettings):
    """The HTTP listener, authentication, body limit and local Responses store."""

    model_config = _config("server")

    host: str = Field("127.0.0.1", min_length=1)
    port: Int = Field(8080, ge=1, le=65535)
    api_key: SecretStr | None = Field(None, min_length=1)
    model_id: str | None = Field(None, min_length=1)  # None = the artifact's identity.model_id
    cors: bool = False
    client_compat: bool = False  # accept / ignore / map real clients' extra fields (api/compat.py)
    max_request_mib: Int = Field(384, ge=1)
    response_store_max_records: Int = Field(1024, ge=1)
    response_store_max_mib: Int = Field(256, ge=1)
    drain_timeout_s: Float = Field(30.0, ge=0.0, allow_inf_nan=False)  # graceful-shutdown wait
    metrics_open: bool = False  # GET /metrics without the API key (a scraper on a private network)
    # a started request's head must arrive within header_timeout_s, its body within body_timeout_s
    # after the head (else 408); an idle connection is closed after keepalive_s
    header_timeout_s: Float = Field(10.0, gt=0.0, le=3600.0, allow_inf_nan=False)
    body_timeout_s: Float = Field(60.0, gt=0.0, le=3600.0, allow_inf_nan=False)
    keepalive_s: Int = Field(5, ge=1, le=3600)


class SamplingSettings(BaseSettings):
    """Process-level sampler overrides (None keeps the model's registered value) and thinking defaults."""

    model_config = _config("sampling")

    temperature: Float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: Float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    top_k: Int | None = Field(None, ge=0)  # 0 = no top-k cut
    min_p: Float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    presence_penalty: Float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: Float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    seed: Int | None = Field(None, ge=0, le=MAX_SEED)  # None = a fresh random seed per request
    greedy: bool = False
    no_thinking: bool = False
    preserve_thinking: bool = False


class LoggingSettings(BaseSettings):
    """Console level, the structured request log and the throughput report."""

    model_config = _config("logging")

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    request_log_jsonl: str | None = Field(None, min_length=1)
    log_stats_interval_ms: Int = Field(5000, ge=0)  # 0 disables the report


class TelemetrySettings(BaseSettings):
    """OpenTelemetry tracing."""

    model_config = _config("telemetry")

    exporter: Literal["none", "console", "otlp"] = "none"
    otlp_endpoint: str | None = Field(None, min_length=1)  # None = the exporter's default endpoint
    service_name: str = Field("ninfer", min_length=1)


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
