"""Opens a `.ninfer` directory: checks files, headers and shapes; loads weights by mmap."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ninfer.artifact import quant_store
from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.files import TensorInfo, read_header, sha256_file
from ninfer.artifact.manifest import MANIFEST, MEDIA_DIR, Manifest, read_manifest
from ninfer.artifact.shapes import expected_shapes, with_splits
from ninfer.artifact.synth_draw import draw_tensor, synthetic_headers, synthetic_spec
from ninfer.model.config import TextConfig, UnknownArchitectureError

if TYPE_CHECKING:  # torch is imported only when weights are loaded (inspect/verify stay light)
    import torch

    from ninfer.formats import QuantWeight
    from ninfer.model.dflash import DFlashConfig

CONFIG = "config.json"
TOKENIZER = "tokenizer/tokenizer.json"
TEMPLATE = "frontend/chat_template.jinja"
GENERATION = "generation.json"
REQUIRED = (CONFIG, TOKENIZER, TEMPLATE, GENERATION)
DFLASH_CONFIG = "dflash/config.json"  # the dflash component's drafter config (its HF config.json)
SYNTHETIC_FILE = "<synthetic>"  # the one pseudo-file of a synthetic component's headers


def _load_json(path: Path) -> Any:
    if not path.is_file():
        raise ArtifactError(f"missing file {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from None


def check_shapes(config: TextConfig, component: str, headers: dict[str, TensorInfo]) -> None:
    """Compare a component's tensors (logical: a quantized tensor once, by name) with the names and
    shapes its config implies; a projection may be stored as its split parts."""
    want = expected_shapes(config, component)
    if want is None:
        return
    want = with_splits(config, want, headers)
    for name, info in headers.items():
        if name not in want:
            raise ArtifactError(f"component {component!r}: unexpected tensor {name!r} for this config")
        if info.shape != want[name]:
            raise ArtifactError(
                f"component {component!r}: shape mismatch for {name}: "
                f"file has {list(info.shape)}, config implies {list(want[name])}"
            )
    missing = [n for n in want if n not in headers]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ArtifactError(f"component {component!r}: missing tensor {missing[0]!r}{more}")


@dataclass
class Artifact:
    """An opened, checked artifact. Weights stay on disk until `load_tensors`."""

    path: Path
    manifest: Manifest
    config: TextConfig
    generation: dict[str, Any]
    chat_template: str
    _headers: dict[str, dict[str, dict[str, TensorInfo]]] = field(default_factory=dict, repr=False)
    # component -> quantized tensor -> format and logical shape (manifest `weight_formats`)
    quantized: dict[str, dict[str, quant_store.QuantSpec]] = field(default_factory=dict)
    weight_profile: str = "bf16"

    @property
    def synthetic(self) -> dict[str, Any] | None:
        """`{"seed": ..., "dtype": ...}` when the weights are drawn at load time (`synth`), else None."""
        return synthetic_spec(self.manifest.extra)

    @property
    def model_id(self) -> str:
        return self.manifest.identity.model_id

    @property
    def family(self) -> str:
        return self.manifest.identity.family

    @property
    def sampler_model_id(self) -> str:
        """The id whose registered sampler presets the engine takes (`registry.sampler_preset`)."""
        return self.model_id

    @property
    def display_name(self) -> str:
        return self.manifest.identity.display_name

    @property
    def tokenizer_path(self) -> Path:
        return self.path / TOKENIZER

    @property
    def components(self) -> tuple[str, ...]:
        return tuple(self.manifest.components)

    def not_loaded(self, component: str) -> str | None:
        """Why a component this artifact carries is not loaded by us (None: it loads, or is absent)."""
        return None

    def has_component(self, name: str) -> bool:
        return name in self.manifest.components

    def dflash_config(self) -> DFlashConfig:
        """The `dflash` component's drafter config, stored beside it (ValueError when it is missing
        or not a usable DFlash config)."""
        from ninfer.model.dflash import DFlashConfig

        path = self.path / DFLASH_CONFIG
        if not path.is_file():
            raise ValueError(f"{path} is missing (the dflash component needs its config)")
        try:
            return DFlashConfig.from_hf(_load_json(path))
        except KeyError as exc:
            raise ValueError(f"{path}: missing field {exc}") from None

    def media_config(self, name: str) -> dict[str, Any] | None:
        """A processor config carried from the checkpoint (`MEDIA_CONFIGS`), or None when absent."""
        path = self.path / MEDIA_DIR / name
        return _load_json(path) if path.is_file() else None

    def _component(self, name: str) -> dict[str, dict[str, TensorInfo]]:
        if name not in self.manifest.components:
            raise ArtifactError(f"{self.path}: no component {name!r} (has {list(self.manifest.components)})")
        return self._headers[name]

    def tensor_bytes(self, component: str) -> int:
        """Payload bytes of a component's tensors (what loading it costs in memory)."""
        return sum(i.nbytes for h in self._component(component).values() for i in h.values())

    def tensor_shapes(self, component: str) -> dict[str, tuple[int, ...]]:
        """Logical shapes by name (a quantized tensor once, not its planes)."""
        return {n: i.shape for n, i in self.tensor_infos(component).items()}

    def tensor_infos(self, component: str) -> dict[str, TensorInfo]:
        """Logical tensors by name: dense ones as stored, quantized ones with their format as dtype."""
        physical = {n: i for h in self._component(component).values() for n, i in h.items()}
        return quant_store.logical_headers(component, physical, self.quantized.get(component, {}))

    def load_tensors(
        self, component: str, device: str | torch.device = "cpu"
    ) -> dict[str, torch.Tensor | QuantWeight]:
        """All tensors of a component, by canonical name (quantized ones as `QuantWeight`s of their
        planes); on CPU they are mmap-backed views (no copy)."""
        return quant_store.assemble(self._load_entries(component, device), self.quantized.get(component, {}))

    def _load_entries(self, component: str, device: str | torch.device) -> dict[str, torch.Tensor]:
        import torch
        from safetensors import safe_open

        out: dict[str, torch.Tensor] = {}
        spec = self.synthetic
        if spec is not None:  # drawn on the device, one tensor at a time (no host copy)
            specs = self.quantized.get(component, {})
            for name, info in self._component(component)[SYNTHETIC_FILE].items():
                owner = specs.get(name.rpartition(quant_store.PLANE_SEP)[0])
                w8 = owner is not None and owner.fmt == "q8_g32"
                out[name] = draw_tensor(name, info.shape, info.dtype, spec["seed"], device, w8)
            return out
        for rel in self._component(component):
            with safe_open(str(self.path / rel), framework="pt", device="cpu") as f:
                for name in f.keys():
                    t = f.get_tensor(name)
                    out[name] = t if torch.device(device).type == "cpu" else t.to(device)
        return out


def open_directory(path: str | Path, verify: bool = False) -> Artifact:
    """Open and check an artifact directory; `verify=True` also recomputes every digest."""
    root = Path(path)
    if not root.is_dir():
        raise ArtifactError(f"artifact {root} does not exist or is not a directory")
    manifest = read_manifest(root)
    listed = {f for c in manifest.components.values() for f in c.files}
    for rel in sorted(set(REQUIRED) | listed | set(manifest.digests)):
        if not (root / rel).is_file():
            raise ArtifactError(f"missing file {root / rel}")
    not_digested = sorted((set(REQUIRED) | listed) - set(manifest.digests))
    if not_digested:
        raise ArtifactError(f"manifest.json: no digest for {not_digested[0]}")
    if verify:
        for rel, want in sorted(manifest.digests.items()):
            if rel == MANIFEST:
                continue
            got = sha256_file(root / rel)
            if got != want:
                raise ArtifactError(
                    f"digest mismatch for {rel}: sha256 {got[:16]}…, manifest says {want[:16]}…"
                )
    cfg_dict = _load_json(root / CONFIG)
    try:
        config = TextConfig.from_dict(cfg_dict)
    except UnknownArchitectureError as exc:
        raise ArtifactError(f"unknown architecture in {root / CONFIG}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"invalid {root / CONFIG}: {exc}") from None
    if config.family != manifest.identity.family:
        raise ArtifactError(
            f"manifest family {manifest.identity.family!r} differs from config family {config.family!r}"
        )
    headers: dict[str, dict[str, dict[str, TensorInfo]]] = {}
    profile, quantized = quant_store.parse(manifest.extra)
    synthetic = synthetic_spec(manifest.extra) is not None
    for name, comp in manifest.components.items():
        if synthetic:  # no files: the headers the config implies (checked against the manifest's counts)
            per_file = {SYNTHETIC_FILE: synthetic_headers(config, name, quantized.get(name, {}))}
        else:
            per_file = {rel: read_header(root / rel) for rel in comp.files}
        merged: dict[str, TensorInfo] = {}
        for rel, h in per_file.items():
            for t in h:
                if t in merged:
                    raise ArtifactError(f"component {name!r}: tensor {t!r} stored twice (again in {rel})")
            merged.update(h)
        if len(merged) != comp.tensor_count:
            raise ArtifactError(
                f"component {name!r}: {len(merged)} tensors on disk, manifest says {comp.tensor_count}"
            )
        check_shapes(config, name, quant_store.logical_headers(name, merged, quantized.get(name, {})))
        headers[name] = per_file
    if not manifest.components.get("mtp") and config.mtp_num_hidden_layers:
        raise ArtifactError(f"config has {config.mtp_num_hidden_layers} MTP layer(s) but no 'mtp' component")
    generation = _load_json(root / GENERATION)
    if not isinstance(generation, dict):
        raise ArtifactError(f"{root / GENERATION}: not a JSON object")
    template = (root / TEMPLATE).read_text(encoding="utf-8")
    return Artifact(
        path=root,
        manifest=manifest,
        config=config,
        generation=generation,
        chat_template=template,
        _headers=headers,
        quantized=quantized,
        weight_profile=profile,
    )
