"""The demo artifact: a small Qwen3.5-architecture model with seeded random weights and the real tokenizer."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ninfer.artifact import registry
from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.manifest import MANIFEST, ArtifactIdentity
from ninfer.artifact.released import RELEASED_GENERATION
from ninfer.artifact.shapes import mtp_shapes, text_shapes
from ninfer.artifact.synth import write_model_files
from ninfer.artifact.writer import ArtifactWriter
from ninfer.model.config import FULL, LINEAR, TextConfig

DEMO_REVISION = 1  # bump when the recipe below changes (part of the cache name)

# A Hugging Face style text config: 8 layers (attention at 3 and 7), head_dim 64 with a 16-wide
# rotary part (mrope_section sums to 8), GDN 4 key / 8 value heads x 32, dense FFN, one MTP layer,
# and the real 248320-entry vocabulary so the real tokenizer and template work unchanged.
DEMO_HF_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "hidden_size": 256,
    "num_hidden_layers": 8,
    "layer_types": [FULL if (i + 1) % 4 == 0 else LINEAR for i in range(8)],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 512,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    },
    "mtp_num_hidden_layers": 1,
    "tie_word_embeddings": False,
}
DEMO_GENERATION_CONFIG = RELEASED_GENERATION


def demo_config() -> TextConfig:
    return TextConfig.from_hf(DEMO_HF_CONFIG, DEMO_GENERATION_CONFIG)


def _random(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """One demo tensor; weights bf16, A_log float32 (as in the released checkpoints)."""
    if name.endswith("linear_attn.A_log"):  # A = exp(A_log) uniform in [1, 16)
        return torch.empty(shape).uniform_(1.0, 16.0, generator=g).log_()
    if name.endswith("linear_attn.norm.weight"):  # plain-weight gated norm: around 1
        t = 1.0 + 0.1 * torch.randn(shape, generator=g)
    elif name.endswith("linear_attn.dt_bias"):
        t = 1.0 + 0.1 * torch.randn(shape, generator=g)
    elif "norm" in name:  # 1+w RMSNorms store the offset w: around 0
        t = 0.1 * torch.randn(shape, generator=g)
    else:  # projections, embedding, lm_head
        t = 0.02 * torch.randn(shape, generator=g)
    return t.to(torch.bfloat16)


Draw = Callable[[str, tuple[int, ...], torch.Generator], torch.Tensor]


def build_demo(
    out: str | Path,
    *,
    seed: int = 0,
    force: bool = False,
    draw: Draw | None = None,
    source: str = "ninfer demo",
) -> Path:
    """Write the demo artifact to `out` deterministically (same seed -> same files and digests).
    `draw` replaces the demo's tensor recipe (test models built on the demo's shapes)."""
    draw = draw or _random
    config = demo_config()
    ident = registry.lookup(registry.DEMO_ID)
    assert ident is not None
    g = torch.Generator().manual_seed(seed)
    with ArtifactWriter(Path(out), overwrite=force) as writer:
        for comp, shapes in (("text", text_shapes(config)), ("mtp", mtp_shapes(config))):
            for name, shape in shapes.items():
                writer.component(comp).add(name, draw(name, shape, g))
        write_model_files(writer, config, ident)
        identity = ArtifactIdentity(
            model_id=ident.model_id,
            family=config.family,
            display_name=ident.display_name,
            source=f"{source} (seed {seed})",
        )
        return writer.finish(identity)


def default_cache_dir() -> Path:
    """`$NINFER_CACHE_DIR` if set, else `~/.cache/ninfer`."""
    env = os.environ.get("NINFER_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ninfer"


def demo_path(cache_dir: str | Path | None = None) -> Path:
    from ninfer.version import __version__

    return Path(cache_dir or default_cache_dir()) / f"demo-{__version__}-r{DEMO_REVISION}.ninfer"


def ensure_demo_artifact(cache_dir: str | Path | None = None) -> Path:
    """The cached demo artifact (seed 0), built on first use; concurrent callers share one result."""
    path = demo_path(cache_dir)
    if (path / MANIFEST).is_file():
        return path
    started = time.monotonic()
    try:
        # a directory without a manifest is a leftover of an interrupted build: replace it
        build_demo(path, seed=0, force=path.exists())
    except (ArtifactError, OSError):
        if not (path / MANIFEST).is_file():  # not a concurrent builder that finished first
            raise
    if not (path / MANIFEST).is_file():
        raise ArtifactError(
            f"building the demo artifact at {path} failed after {time.monotonic() - started:.0f}s"
        )
    return path
