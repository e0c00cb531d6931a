"""Validated server settings: Hydra groups under conf/ -> frozen pydantic-settings models."""

from __future__ import annotations

from ninfer.config.errors import ConfigError
from ninfer.config.loader import load_settings, settings_from_config
from ninfer.config.options import argv_redacted
from ninfer.config.settings import Settings, check_against_artifact, check_artifact_settings

__all__ = [
    "ConfigError",
    "Settings",
    "argv_redacted",
    "check_against_artifact",
    "check_artifact_settings",
    "load_settings",
    "settings_from_config",
]
