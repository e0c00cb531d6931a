"""The `.ninfer` artifact format: reader, writer, Hugging Face converter, demo and model registry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.manifest import FORMAT_VERSION, ArtifactIdentity, Component, Manifest
from ninfer.artifact.opener import open_artifact
from ninfer.artifact.reader import Artifact
from ninfer.artifact.shapes import expected_shapes

if TYPE_CHECKING:
    from ninfer.artifact.demo import build_demo, ensure_demo_artifact

__all__ = [
    "FORMAT_VERSION",
    "Artifact",
    "ArtifactError",
    "ArtifactIdentity",
    "Component",
    "Manifest",
    "build_demo",
    "ensure_demo_artifact",
    "expected_shapes",
    "open_artifact",
]


def __getattr__(name: str) -> Any:  # lazy: opening an artifact must not import torch
    if name in ("build_demo", "ensure_demo_artifact"):
        from ninfer.artifact import demo

        return getattr(demo, name)
    raise AttributeError(name)
