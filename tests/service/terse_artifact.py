"""A demo-shaped artifact whose random model ends its turns after a few tokens (client tests).

The demo model almost never emits `<|im_end|>`, and real CLIs treat an answer cut at the output
limit as an error. Here every embedding carries a large constant in hidden dim 0, so the final
normed hidden state has a large positive dim 0 whatever the context; the lm_head column 0 then acts
as a per-token bias: `<|im_end|>` and `</think>` get a margin over the ordinary tokens (sampling
ends a turn after a few tokens; greedy ends it at once), and every other special token (tool-call
markup included) is pushed down, so answers are short plain text.

`python tests/service/terse_artifact.py OUT` builds it; `ensure_terse_artifact(cache)` caches it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ninfer.artifact.demo import _random, build_demo
from ninfer.artifact.manifest import MANIFEST
from ninfer.text.builder import EXPECTED_IDS

REVISION = 1  # bump when the recipe changes (part of the cache name)
IM_END, THINK_END = EXPECTED_IDS["<|im_end|>"], EXPECTED_IDS["</think>"]
FIRST_SPECIAL = min(EXPECTED_IDS.values())
EMBED_BIAS = 5.0  # hidden dim 0 of every embedding (the layers add ~0.3 rms)
# lm_head[:, 0] for the turn enders; ordinary tokens draw 0.02 * N(0, 1) there
END_WEIGHT, THINK_END_WEIGHT, SPECIAL_WEIGHT = 0.25, 0.2, -0.2


def _tensor(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    t = _random(name, shape, g)
    if name == "model.embed_tokens.weight":
        t[:, 0] = EMBED_BIAS
    elif name == "lm_head.weight":
        t[FIRST_SPECIAL:, 0] = SPECIAL_WEIGHT
        t[IM_END, 0] = END_WEIGHT
        t[THINK_END, 0] = THINK_END_WEIGHT
    return t


def build_terse(out: str | Path, *, seed: int = 0) -> Path:
    """Write the terse artifact to `out` deterministically (the demo recipe, two edits)."""
    return build_demo(out, seed=seed, force=True, draw=_tensor, source="ninfer terse test model")


def ensure_terse_artifact(cache_dir: Path) -> Path:
    path = cache_dir / f"terse-r{REVISION}.ninfer"
    if not (path / MANIFEST).is_file():
        build_terse(path)
    return path


if __name__ == "__main__":
    print(build_terse(sys.argv[1]))
