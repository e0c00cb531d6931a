"""The `manifest.json` of a `.ninfer` artifact: dataclasses, JSON (de)serialisation, validation."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ninfer.artifact.errors import ArtifactError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
COMPONENTS = ("text", "mtp", "vision", "lm_head_draft", "dflash")
FAMILIES = ("qwen3_5", "qwen3_5_moe")
MEDIA_DIR = "media"  # optional: the checkpoint's image / video processor configs
MEDIA_CONFIGS = ("preprocessor_config.json", "video_preprocessor_config.json")


@dataclass(frozen=True)
class ArtifactIdentity:
    """Who the weights are: the public model id and where they came from."""

    model_id: str
    family: str
    display_name: str
    source: str  # e.g. "Qwen/Qwen3.6-27B@<revision>" or a directory name


@dataclass(frozen=True)
class Component:
    """One group of weight files loaded together (`text`, `mtp`, `vision`, ...)."""

    files: tuple[str, ...]  # paths relative to the artifact root, e.g. "weights/mtp.safetensors"
    tensor_count: int
    bytes: int  # sum of tensor payload bytes (not file sizes)


@dataclass(frozen=True)
class Manifest:
    """The parsed `manifest.json`."""

    format_version: int
    identity: ArtifactIdentity
    components: dict[str, Component]
    digests: dict[str, str]  # relative path -> sha256 hex, every file except manifest.json
    created_by: str
    extra: dict[str, Any] = field(default_factory=dict)  # unknown top-level keys, kept verbatim

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "identity": {
                "model_id": self.identity.model_id,
                "family": self.identity.family,
                "display_name": self.identity.display_name,
                "source": self.identity.source,
            },
            "components": {
                name: {"files": list(c.files), "tensor_count": c.tensor_count, "bytes": c.bytes}
                for name, c in self.components.items()
            },
            "digests": dict(sorted(self.digests.items())),
            "created_by": self.created_by,
            **self.extra,
        }

    def write(self, root: Path) -> None:
        (root / MANIFEST).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")


def _need(d: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise ArtifactError(f"manifest.json: missing {where}{key!r}")
    value = d[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ArtifactError(f"manifest.json: {where}{key!r} has the wrong type ({type(value).__name__})")
    return value


def parse_manifest(d: Any) -> Manifest:
    """Validate a decoded `manifest.json`; every problem raises ArtifactError with one line."""
    if not isinstance(d, dict):
        raise ArtifactError("manifest.json: top level is not a JSON object")
    version = _need(d, "format_version", int, "")
    if version != FORMAT_VERSION:
        raise ArtifactError(
            f"unknown artifact format_version {version} (this ninfer reads version {FORMAT_VERSION})"
        )
    ident = _need(d, "identity", dict, "")
    identity = ArtifactIdentity(
        model_id=_need(ident, "model_id", str, "identity."),
        family=_need(ident, "family", str, "identity."),
        display_name=_need(ident, "display_name", str, "identity."),
        source=_need(ident, "source", str, "identity."),
    )
    if identity.family not in FAMILIES:
        raise ArtifactError(f"unknown architecture family {identity.family!r}; known: {list(FAMILIES)}")
    if not identity.model_id:
        raise ArtifactError("manifest.json: identity.model_id is empty")
    components: dict[str, Component] = {}
    synthetic = d.get("synthetic_weights") is not None  # weights drawn at load time: no files (synth.py)
    for name, c in _need(d, "components", dict, "").items():
        if name not in COMPONENTS:
            raise ArtifactError(f"manifest.json: unknown component {name!r}; known: {list(COMPONENTS)}")
        if not isinstance(c, dict):
            raise ArtifactError(f"manifest.json: component {name!r} is not an object")
        files = _need(c, "files", list, f"components.{name}.")
        if (not files and not synthetic) or not all(isinstance(f, str) for f in files):
            raise ArtifactError(f"manifest.json: components.{name}.files must be a non-empty list of paths")
        components[name] = Component(
            files=tuple(files),
            tensor_count=_need(c, "tensor_count", int, f"components.{name}."),
            bytes=_need(c, "bytes", int, f"components.{name}."),
        )
    if "text" not in components:
        raise ArtifactError("manifest.json: the artifact has no 'text' component")
    digests = _need(d, "digests", dict, "")
    for rel, hexd in digests.items():
        if not isinstance(hexd, str) or len(hexd) != 64:
            raise ArtifactError(f"manifest.json: digest of {rel!r} is not a sha256 hex string")
    known = {"format_version", "identity", "components", "digests", "created_by"}
    return Manifest(
        format_version=version,
        identity=identity,
        components=components,
        digests=dict(digests),
        created_by=_need(d, "created_by", str, ""),
        extra={k: v for k, v in d.items() if k not in known},
    )


def read_manifest(root: Path) -> Manifest:
    path = root / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"missing file {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from None
    return parse_manifest(data)
