"""The `.ninfer` artifact format: reader, writer, Hugging Face converter, demo and model registry."""

from __future__ import annotations

from ninfer.artifact.demo import build_demo, ensure_demo_artifact
from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.manifest import FORMAT_VERSION, ArtifactIdentity, Component, Manifest
from ninfer.artifact.reader import Artifact, open_artifact
from ninfer.artifact.shapes import expected_shapes

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
