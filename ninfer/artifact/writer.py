"""Writes a `.ninfer` directory: sharded safetensors per component, side files, digests, manifest."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from ninfer.artifact import quant_store
from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.files import digest_tree
from ninfer.artifact.manifest import COMPONENTS, FORMAT_VERSION, ArtifactIdentity, Component, Manifest
from ninfer.artifact.quant_store import QuantSpec

if TYPE_CHECKING:
    from ninfer.formats import QuantWeight

SHARD_BYTES = 2 << 30  # 2 GiB per shard (a single larger tensor gets a shard of its own)
NUMBERED = (
    "text",
    "vision",
)  # always `NAME-0000i-of-0000N.safetensors`; others one `NAME.safetensors` if they fit


def created_by() -> str:
    from ninfer.version import __version__

    return f"ninfer {__version__}"


class ComponentWriter:
    """Buffers tensors of one component and writes them out in shards of at most `max_bytes`."""

    def __init__(self, root: Path, name: str, max_bytes: int) -> None:
        self.root, self.name, self.max_bytes = root, name, max_bytes
        self._buf: dict[str, torch.Tensor] = {}
        self._buf_bytes = 0
        self._parts: list[Path] = []
        self._names: set[str] = set()
        self.quantized: dict[str, QuantSpec] = {}  # quantized tensors' specs (their planes are entries)
        self.tensor_count = 0
        self.bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self._names:
            raise ArtifactError(f"tensor {name!r} appears twice in component {self.name!r}")
        t = tensor.detach().to("cpu").contiguous()
        if t.untyped_storage().nbytes() != t.nbytes:  # a view into a larger buffer: store only its bytes
            t = t.clone()
        if self._buf and self._buf_bytes + t.nbytes > self.max_bytes:
            self._flush()
        self._names.add(name)
        self._buf[name] = t
        self._buf_bytes += t.nbytes
        self.tensor_count += 1
        self.bytes += t.nbytes

    def add_quantized(self, name: str, weight: QuantWeight) -> QuantSpec:
        """A quantized tensor as its planes (`NAME#base`, ...); its spec goes to the manifest."""
        for plane, t in weight.planes().items():
            self.add(quant_store.plane_name(name, plane), t)
        spec = quant_store.QuantSpec(weight.fmt.name, weight.shape)
        self.quantized[name] = spec
        return spec

    def _flush(self) -> None:
        part = self.root / "weights" / f".{self.name}.part{len(self._parts):05d}"
        part.parent.mkdir(parents=True, exist_ok=True)
        save_file(self._buf, str(part), metadata={"format": "pt"})
        self._parts.append(part)
        self._buf, self._buf_bytes = {}, 0

    def finish(self) -> Component:
        if self._buf:
            self._flush()
        if not self._parts:
            raise ArtifactError(f"component {self.name!r} has no tensors")
        n = len(self._parts)
        files = []
        for i, part in enumerate(self._parts):
            if n == 1 and self.name not in NUMBERED:
                rel = f"weights/{self.name}.safetensors"
            else:
                rel = f"weights/{self.name}-{i + 1:05d}-of-{n:05d}.safetensors"
            part.rename(self.root / rel)
            os.chmod(self.root / rel, 0o644)
            files.append(rel)
        return Component(files=tuple(files), tensor_count=self.tensor_count, bytes=self.bytes)


class ArtifactWriter:
    """Builds an artifact in a temporary sibling directory and renames it into place on `finish`."""

    def __init__(self, out: Path, *, overwrite: bool = False, max_shard_bytes: int = SHARD_BYTES) -> None:
        self.out = Path(out)
        if self.out.exists() and not overwrite:
            raise ArtifactError(f"output {self.out} already exists (pass --force to replace it)")
        self.overwrite = overwrite
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", suffix=".tmp", dir=self.out.parent))
        self.max_shard_bytes = max_shard_bytes
        self.components: dict[str, ComponentWriter] = {}
        self.profile = "bf16"  # the weight profile recorded when a component holds quantized tensors

    def component(self, name: str) -> ComponentWriter:
        if name not in COMPONENTS:
            raise ArtifactError(f"unknown component {name!r}; known: {list(COMPONENTS)}")
        if name not in self.components:
            self.components[name] = ComponentWriter(self.tmp, name, self.max_shard_bytes)
        return self.components[name]

    def write_text(self, rel: str, text: str) -> None:
        path = self.tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="")

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_text(rel, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")

    def copy_file(self, rel: str, src: Path) -> None:
        path = self.tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, path)

    def finish(
        self,
        identity: ArtifactIdentity,
        *,
        synthetic: dict[str, Component] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Close every component, digest all files, write the manifest and move into place.
        `synthetic`: components without files (weights drawn at load time, see `synth`);
        `extra`: additional top-level manifest keys."""
        components = {name: w.finish() for name, w in self.components.items()}
        quantized = {name: w.quantized for name, w in self.components.items() if w.quantized}
        extra = dict(extra or {})
        if quantized:
            extra[quant_store.KEY] = quant_store.manifest_entry(self.profile, quantized)
        components.update(synthetic or {})
        if "text" not in components:
            raise ArtifactError("an artifact needs a 'text' component")
        manifest = Manifest(
            format_version=FORMAT_VERSION,
            identity=identity,
            components=components,
            digests=digest_tree(self.tmp),
            created_by=created_by(),
            extra=extra,
        )
        manifest.write(self.tmp)
        os.chmod(self.tmp, 0o755)
        if self.out.exists() and not self.overwrite:
            raise ArtifactError(f"output {self.out} appeared while it was being built")
        if self.out.exists():
            old = self.out.with_name(f".{self.out.name}.old-{os.getpid()}")
            self.out.rename(old)
            self.tmp.rename(self.out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            self.tmp.rename(self.out)
        return self.out

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None or self.tmp.exists():
            self.abort()


_SAMPLER_KEYS = (
    "do_sample", "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "presence_penalty", "frequency_penalty",
)  # fmt: skip


def generation_json(
    eos_token_ids: tuple[int, ...], generation_config: dict[str, Any] | None
) -> dict[str, Any]:
    """The `generation.json` document: stop ids plus the sampler values the source shipped (if any)."""
    gen = generation_config or {}
    return {
        "eos_token_ids": list(eos_token_ids),
        "bos_token_id": gen.get("bos_token_id"),
        "pad_token_id": gen.get("pad_token_id"),
        "sampler": {k: gen[k] for k in _SAMPLER_KEYS if gen.get(k) is not None},
    }
