"""Loads what `--spec` needs from the artifact, and nothing without it (residency is frozen at startup)."""

from __future__ import annotations

from typing import Any

import torch

from ninfer.engine.api import EngineConfigError
from ninfer.engine.spec.draft_head import DraftHead

DEFAULT_DRAFT_TOKENS = 3


def spec_fields(spec: Any) -> dict[str, Any]:
    """`SpecSettings` -> the EngineConfig speculative fields."""
    if spec.method is None:
        return {}
    k = spec.draft_tokens if spec.draft_tokens is not None else DEFAULT_DRAFT_TOKENS
    return {"spec_method": spec.method, "draft_tokens": k, "lm_head_draft": spec.lm_head_draft}


def load_spec_weights(
    spec: Any, artifact: Any, model: Any, dtype: torch.dtype, device: str | torch.device
) -> DraftHead | None:
    """Attach the MTP head (spec.method == "mtp", and the proposal head if asked) or the DFlash drafter
    (spec.method == "dflash") to `model`."""
    if spec.method is None:
        return None
    if spec.method == "dflash":
        load_dflash_drafter(artifact, model, dtype, device)
        if spec.lm_head_draft:
            raise EngineConfigError("spec.lm_head_draft applies to spec mtp only, not dflash")
        return None
    from ninfer.model.weights import load_mtp

    if not artifact.has_component("mtp"):
        raise EngineConfigError("spec.method=mtp: this artifact carries no MTP head")
    load_mtp(artifact.config, artifact.load_tensors("mtp", device=device), model, dtype, device)
    if not spec.lm_head_draft:
        return None
    if not artifact.has_component("lm_head_draft"):
        raise EngineConfigError(
            "spec.lm_head_draft: this artifact has no 'lm_head_draft' component "
            "(add one with `python -m ninfer.artifact lm-head-draft`)"
        )
    cfg = artifact.config
    return DraftHead.from_tensors(
        artifact.load_tensors("lm_head_draft"), cfg.vocab_size, cfg.hidden_size, dtype, device
    )


def load_dflash_drafter(artifact: Any, model: Any, dtype: torch.dtype, device: str | torch.device) -> None:
    """Attach the artifact's `dflash` component to `model` as `model.dflash`."""
    from ninfer.artifact.dflash import COMPONENT, read_dflash_config
    from ninfer.model.dflash import load_dflash

    if not artifact.has_component(COMPONENT):
        raise EngineConfigError(
            "spec.method=dflash: this artifact carries no DFlash drafter "
            "(add one with `python -m ninfer.artifact add-dflash ARTIFACT DRAFTER_HF_DIR`)"
        )
    try:
        cfg = read_dflash_config(artifact.path)
        model.dflash = load_dflash(cfg, artifact.load_tensors(COMPONENT), dtype, device)
    except ValueError as exc:
        raise EngineConfigError(f"spec.method=dflash: {exc}") from None
