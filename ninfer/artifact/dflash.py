"""The `dflash` component: a DFlash block drafter's weights plus its HF config as a side file.

Stored as `weights/dflash*.safetensors` (the drafter's tensors under their HF names) and
`dflash/config.json` (the drafter checkpoint's config.json, verbatim; for a seed file's companion
written by `import`, its config in that form, and its W8 matrices as quantized planes, dequantized
when the drafter is built). The drafter has no embedding or head of its own: it uses the target's
`embed_tokens` and `lm_head`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.files import digest_tree
from ninfer.artifact.manifest import read_manifest
from ninfer.artifact.reader import DFLASH_CONFIG as CONFIG

COMPONENT = "dflash"


def add_dflash(artifact_path: str | Path, drafter_dir: str | Path) -> Path:
    """Add (or replace) the `dflash` component from a drafter's HF directory and re-digest the manifest."""
    from safetensors import safe_open

    from ninfer.artifact.opener import open_artifact
    from ninfer.artifact.writer import SHARD_BYTES, ComponentWriter
    from ninfer.model.dflash import DFlashConfig, load_dflash

    src = Path(drafter_dir)
    files = sorted(src.glob("*.safetensors"))
    if not (src / "config.json").is_file() or not files:
        raise ArtifactError(f"{src}: a DFlash drafter directory needs config.json and *.safetensors")
    art = open_artifact(artifact_path)
    target = art.config
    try:
        cfg = DFlashConfig.from_hf(json.loads((src / "config.json").read_text(encoding="utf-8")))
    except (ValueError, KeyError) as exc:
        raise ArtifactError(f"{src}/config.json: not a DFlash drafter config ({exc})") from None
    n_layers = len(target.layer_types)
    if cfg.hidden_size != target.hidden_size or not all(0 <= i < n_layers for i in cfg.target_layer_ids):
        raise ArtifactError(
            f"DFlash drafter (hidden {cfg.hidden_size}, target layers {list(cfg.target_layer_ids)}) does not fit "
            f"this target (hidden {target.hidden_size}, {n_layers} layers)"
        )
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        raise ArtifactError(f"DFlash mask_token_id {cfg.mask_token_id} is outside the vocabulary")
    tensors = {}
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as h:
            tensors |= {name: h.get_tensor(name) for name in h.keys()}
    try:
        load_dflash(cfg, tensors, next(iter(tensors.values())).dtype, "meta")  # names and shapes
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None
    root = art.path
    old = art.manifest.components.get(COMPONENT)
    if old is not None:
        for rel in old.files:
            (root / rel).unlink()
    writer = ComponentWriter(root, COMPONENT, SHARD_BYTES)
    for name, t in tensors.items():
        writer.add(name, t)
    component = writer.finish()
    (root / CONFIG).parent.mkdir(exist_ok=True)
    shutil.copyfile(src / "config.json", root / CONFIG)
    manifest = read_manifest(root)
    components = {**manifest.components, COMPONENT: component}
    dataclasses.replace(manifest, components=components, digests=digest_tree(root)).write(root)
    return root
