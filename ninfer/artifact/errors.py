"""The one exception type for every unusable artifact or conversion input."""

from __future__ import annotations


class ArtifactError(Exception):
    """An artifact (or a conversion source) cannot be used; the message is one clear line."""
