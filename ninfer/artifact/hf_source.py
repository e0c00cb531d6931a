"""Reads a Hugging Face checkpoint directory: config, weight files, template, tokenizer, source name."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.files import TensorInfo, read_header

_SNAPSHOT = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>[^/]+)$")


@dataclass(frozen=True)
class HfSource:
    """What a conversion needs from a checkpoint directory (weights are read later, file by file)."""

    root: Path
    config: dict[str, Any]
    generation_config: dict[str, Any] | None
    files: tuple[Path, ...]  # safetensors files in reading order
    headers: dict[Path, dict[str, TensorInfo]]
    chat_template: str | None
    tokenizer_json: Path | None
    name: str  # e.g. "Qwen3.6-27B"
    source: str  # e.g. "Qwen/Qwen3.6-27B@<revision>" or the directory name


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"cannot read {path}: {exc}") from None


def _weight_files(root: Path) -> tuple[Path, ...]:
    """Shards named by `model.safetensors.index.json` (if any), then every other top-level file."""
    files: list[Path] = []
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ArtifactError(f"{index}: no weight_map")
        for rel in dict.fromkeys(weight_map.values()):
            if not (root / rel).is_file():
                raise ArtifactError(f"missing file {root / rel} (named by {index.name})")
            files.append(root / rel)
    for p in sorted(root.glob("*.safetensors")):
        if p not in files:
            files.append(p)
    if not files:
        raise ArtifactError(f"no *.safetensors weight files in {root}")
    return tuple(files)


def _template(root: Path) -> str | None:
    path = root / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    cfg = root / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    tpl = _json(cfg).get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default")
    return tpl if isinstance(tpl, str) and tpl else None


def _names(root: Path) -> tuple[str, str]:
    """(name, source): a Hugging Face cache snapshot path gives `org/name@revision`."""
    resolved = root.resolve()
    if resolved.parent.name == "snapshots" and (m := _SNAPSHOT.match(resolved.parent.parent.name)):
        return m["name"], f"{m['org']}/{m['name']}@{resolved.name}"
    return resolved.name, resolved.name


def read_hf_source(root: str | Path) -> HfSource:
    """Collect everything but the tensor data; every problem raises ArtifactError."""
    root = Path(root)
    if not root.is_dir():
        raise ArtifactError(f"Hugging Face directory {root} does not exist")
    cfg_path = root / "config.json"
    if not cfg_path.is_file():
        raise ArtifactError(f"missing file {cfg_path}")
    config = _json(cfg_path)
    gen_path = root / "generation_config.json"
    generation = _json(gen_path) if gen_path.is_file() else None
    files = _weight_files(root)
    headers = {f: read_header(f) for f in files}
    tok = root / "tokenizer.json"
    name, source = _names(root)
    return HfSource(
        root=root,
        config=config,
        generation_config=generation,
        files=files,
        headers=headers,
        chat_template=_template(root),
        tokenizer_json=tok if tok.is_file() else None,
        name=name,
        source=source,
    )
