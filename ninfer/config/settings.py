"""The root Settings: the ten groups plus the rules that span groups and the artifact."""

from __future__ import annotations

import os
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ninfer.config.errors import REDACTED, ConfigError
from ninfer.config.groups import (
    ColdTierSettings,
    EngineSettings,
    KVSettings,
    LoggingSettings,
    ModelSettings,
    SamplingSettings,
    ServerSettings,
    SpecSettings,
    TelemetrySettings,
    VisionSettings,
)
from ninfer.model.config import PAGE_SIZE as PAGE_TOKENS  # the KV pool counts in these pages

MOE_FAMILY = "qwen3_5_moe"  # the 35B-A3B family, the only one with a DFlash drafter


def _pages(tokens: int) -> int:
    return -(-tokens // PAGE_TOKENS)


class Settings(BaseModel):
    """Everything the server needs, validated and frozen; ``Settings()`` reads only NINFER_* env."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelSettings = Field(default_factory=ModelSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    kv: KVSettings = Field(default_factory=KVSettings)
    spec: SpecSettings = Field(default_factory=SpecSettings)
    vision: VisionSettings = Field(default_factory=VisionSettings)
    cold_tier: ColdTierSettings = Field(default_factory=ColdTierSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)

    @model_validator(mode="after")
    def _cross_group_rules(self) -> Settings:
        if self.spec.method == "dflash" and self.vision.enabled:
            raise ConfigError.for_key(
                "vision.enabled", True, "cannot be combined with spec.method=dflash (DFlash is text-only)"
            )
        self._check_kv_capacity()
        device = self.cold_tier.device
        if self.cold_tier.enabled and device >= 0 and device == self.engine.device:
            raise ConfigError.for_key(
                "cold_tier.device", device, f"must be -1 or a secondary device, not engine.device={device}"
            )
        log_path = self.logging.request_log_jsonl
        artifact = self.model.artifact
        if log_path and artifact and os.path.realpath(log_path) == os.path.realpath(artifact):
            raise ConfigError.for_key(
                "logging.request_log_jsonl", log_path, "must not resolve to model.artifact"
            )
        return self

    def _check_kv_capacity(self) -> None:
        # the pool must hold one full sequence and one page per lane, and no more than all lanes can use
        capacity = self.kv_capacity_tokens
        if capacity is None:  # auto: sized by the engine after the weights are loaded
            return
        lanes = self.engine.max_concurrency
        lo = max(self.engine.max_context, PAGE_TOKENS * (lanes - 1) + 1)
        hi = lanes * _pages(self.engine.max_context) * PAGE_TOKENS
        if not lo <= capacity <= hi:
            why = (
                f"must be an integer in {lo}..{hi} (at least one engine.max_context={self.engine.max_context} "
                f"sequence and one {PAGE_TOKENS}-token page per lane, at most what "
                f"engine.max_concurrency={lanes} lanes can use)"
            )
            if self.kv.capacity is None:
                why += "; unset, it follows engine.max_context"
            raise ConfigError.for_key("kv.capacity", self.kv.capacity, why)

    @property
    def kv_capacity_tokens(self) -> int | None:
        """The explicit KV pool size in tokens (engine.max_context when unset); None for auto."""
        if self.kv.capacity == "auto":
            return None
        return self.engine.max_context if self.kv.capacity is None else self.kv.capacity

    def redacted_dump(self) -> dict[str, Any]:
        """A JSON-ready dict of every setting with the API key replaced by ``<redacted>``."""
        data = self.model_dump(mode="json")
        if self.server.api_key is not None:
            data["server"]["api_key"] = REDACTED
        return data


def check_against_artifact(
    settings: Settings,
    family: str,
    *,
    has_mtp: bool | None = None,
    has_vision: bool | None = None,
    max_position_embeddings: int | None = None,
    has_lm_head_draft: bool | None = None,
    has_dflash: bool | None = None,
    not_loaded: dict[str, str] | None = None,
) -> None:
    """Rules that need the opened artifact; the service calls this before allocating anything.

    ``family`` is the text family (``qwen3_5`` dense or ``qwen3_5_moe``); the optional facts are
    checked only when given; ``not_loaded`` maps a component the artifact carries but this server
    does not load (``vision``, ``dflash``, ``lm_head_draft``) to why. Raises ConfigError naming the
    setting that the artifact cannot honour.
    """
    unloaded = not_loaded or {}
    for key, on, comp in (
        ("vision.enabled", settings.vision.enabled, "vision"),
        ("spec.method", settings.spec.method == "dflash", "dflash"),
        ("spec.lm_head_draft", settings.spec.lm_head_draft, "lm_head_draft"),
    ):
        if on and comp in unloaded:
            raise ConfigError.for_key(key, "dflash" if comp == "dflash" else True, unloaded[comp])
    if settings.spec.method == "dflash" and family != MOE_FAMILY:
        raise ConfigError.for_key(
            "spec.method",
            "dflash",
            f"needs the 35B-A3B artifact (family {MOE_FAMILY}), this artifact is {family}",
        )
    if settings.spec.method == "dflash" and has_dflash is False:
        raise ConfigError.for_key(
            "spec.method",
            "dflash",
            "this artifact carries no DFlash drafter "
            "(add one with `python -m ninfer.artifact add-dflash ARTIFACT DRAFTER_HF_DIR`)",
        )
    if settings.spec.method == "mtp" and has_mtp is False:
        raise ConfigError.for_key("spec.method", "mtp", "this artifact carries no MTP head")
    if settings.spec.lm_head_draft and has_lm_head_draft is False:
        raise ConfigError.for_key(
            "spec.lm_head_draft",
            True,
            "this artifact has no 'lm_head_draft' proposal head: drop --lm-head-draft, or add "
            "one with `python -m ninfer.artifact lm-head-draft`",
        )
    if settings.vision.enabled and has_vision is False:
        raise ConfigError.for_key("vision.enabled", True, "this artifact carries no vision tower")
    if max_position_embeddings is not None and settings.engine.max_context > max_position_embeddings:
        raise ConfigError.for_key(
            "engine.max_context",
            settings.engine.max_context,
            f"must be an integer in 1..{max_position_embeddings} for this artifact",
        )


class _ArtifactConfig(Protocol):
    @property
    def max_position_embeddings(self) -> int: ...


class OpenedArtifact(Protocol):
    """What the artifact checks read of an opened artifact (`ninfer.artifact.Artifact`)."""

    @property
    def family(self) -> str: ...

    @property
    def config(self) -> _ArtifactConfig: ...

    def has_component(self, name: str) -> bool: ...

    def not_loaded(self, component: str) -> str | None: ...


def check_artifact_settings(settings: Settings, artifact: OpenedArtifact) -> None:
    """`check_against_artifact` with every fact of an opened artifact (its manifest only, no
    weights): the one check the server's master, its worker and the one-shot CLI run before they
    bind a port or load anything."""
    check_against_artifact(
        settings,
        artifact.family,
        has_mtp=artifact.has_component("mtp"),
        has_vision=artifact.has_component("vision"),
        max_position_embeddings=artifact.config.max_position_embeddings,
        has_lm_head_draft=artifact.has_component("lm_head_draft"),
        has_dflash=artifact.has_component("dflash"),
        not_loaded={
            c: why
            for c in ("vision", "dflash", "lm_head_draft")
            if (why := artifact.not_loaded(c)) is not None
        },
    )
