"""Startup checks and construction of the speculative decoder from the engine's settings."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.engine.config import DFLASH_MAX_DRAFT, MTP_MAX_DRAFT, EngineConfig
from ninfer.engine.slots import SlotLayout
from ninfer.engine.speculative.decoder import Drafter, SpecDecoder
from ninfer.engine.speculative.dflash import DFlashEngineDrafter
from ninfer.engine.speculative.draft_head import DraftHead
from ninfer.engine.speculative.mtp import MTPDrafter
from ninfer.engine.speculative.oracle import OracleDrafter
from ninfer.engine.types import EngineConfigError
from ninfer.model.cache import KVPool, StatePool
from ninfer.model.config import MOE
from ninfer.model.dflash import DFlashDrafter


@dataclass(frozen=True)
class Drafters:
    """The speculative weights loaded beside the target for --spec (none without it): the MTP
    proposal head (`lm_head_draft`) and the DFlash drafter. The MTP layer itself is part of the
    target model (it reads the model's own hidden states and KV); these are passed to the engine."""

    draft_head: DraftHead | None = None
    dflash: DFlashDrafter | None = None


def check_spec(
    config: EngineConfig,
    model: torch.nn.Module,
    draft_head: DraftHead | None,
    dflash: DFlashDrafter | None = None,
) -> None:
    """The startup rejections: each one clear line, before anything is allocated."""
    method = config.spec_method
    if dflash is not None and method != "dflash":
        raise EngineConfigError("a DFlash drafter was given but spec.method is not dflash")
    if method is None:
        if config.lm_head_draft or draft_head is not None:
            raise EngineConfigError("lm_head_draft requires a speculative method (--spec mtp)")
        if config.spec_oracle_wrong_fraction is not None:
            raise EngineConfigError("spec_oracle_wrong_fraction requires a speculative method (--spec mtp)")
        return
    if method == "dflash":
        check_dflash(config, model, draft_head, dflash)
        return
    if method != "mtp":
        raise EngineConfigError(
            f"unknown speculative method {method!r}; this build supports 'mtp' and 'dflash'"
        )
    if not 1 <= config.draft_tokens <= MTP_MAX_DRAFT:
        raise EngineConfigError(
            f"draft_tokens must be in 1..{MTP_MAX_DRAFT} with spec mtp, got {config.draft_tokens}"
        )
    oracle = config.spec_oracle_wrong_fraction is not None
    if not oracle and getattr(model, "mtp", None) is None:
        raise EngineConfigError("spec.method=mtp: the model has no MTP head loaded (artifact without 'mtp')")
    if config.lm_head_draft and draft_head is None:
        raise EngineConfigError("lm_head_draft: the artifact has no 'lm_head_draft' component")
    if draft_head is not None and not config.lm_head_draft:
        raise EngineConfigError("a proposal head was given but lm_head_draft is off")


def check_dflash(
    config: EngineConfig, model: torch.nn.Module, draft_head: DraftHead | None, dflash: DFlashDrafter | None
) -> None:
    """--spec dflash: a 35B-A3B-family (MoE) text target with the artifact's DFlash drafter loaded."""
    if not 1 <= config.draft_tokens <= DFLASH_MAX_DRAFT:
        raise EngineConfigError(
            f"draft_tokens must be in 1..{DFLASH_MAX_DRAFT} with spec dflash, got {config.draft_tokens}"
        )
    if model.config.family != MOE:
        raise EngineConfigError(
            f"spec.method=dflash needs a {MOE} (35B-A3B) target, this model is {model.config.family}"
        )
    if config.lm_head_draft or draft_head is not None:
        raise EngineConfigError("lm_head_draft applies to spec mtp only, not dflash")
    if config.spec_oracle_wrong_fraction is None and dflash is None:
        raise EngineConfigError("spec.method=dflash: no DFlash drafter loaded (artifact without 'dflash')")


def draft_slots(config: EngineConfig) -> int:
    """GDN slots per lane reserved for speculation: one per draft position, receiving the state
    after each verified input but the last (none without --spec: residency is frozen)."""
    return config.draft_tokens if config.spec_method is not None else 0


def build_spec(
    config: EngineConfig,
    model: torch.nn.Module,
    kv: KVPool,
    states: StatePool,
    layout: SlotLayout,
    max_pages: int,
    draft_head: DraftHead | None = None,
    cuda_graph: bool = False,
    dflash: DFlashDrafter | None = None,
) -> SpecDecoder | None:
    """The decoder for `config.spec_method`, or None when speculation is off. `cuda_graph`: the step
    graphs are captured (the runner's manager then captures the MTP drafter's proposal graphs
    too, `SpecDecoder.add_graphs`)."""
    check_spec(config, model, draft_head, dflash)
    if config.spec_method is None:
        return None
    device, dtype = kv.device, kv.dtype
    if layout.draft_slots < config.draft_tokens:
        raise EngineConfigError(
            f"the slot layout reserves {layout.draft_slots} speculative slots per lane, "
            f"{config.draft_tokens} needed (draft_slots(config))"
        )

    def scratch(live_slot: int) -> tuple[int, ...]:
        return layout.drafts(live_slot // layout.per_lane)

    drafter: Drafter
    if config.spec_oracle_wrong_fraction is not None:  # drafts through the lane's scratch slots
        drafter = OracleDrafter(
            scratch, model.config.vocab_size,
            config.spec_oracle_wrong_fraction, config.spec_oracle_seed, config.vocab_limit,
        )  # fmt: skip
    elif config.spec_method == "dflash":
        assert dflash is not None  # check_spec
        drafter = DFlashEngineDrafter(model, dflash, kv.num_pages, dtype, device, config.vocab_limit)
    else:
        mtp = MTPDrafter(
            model, kv.num_pages, layout.num_slots, max_pages, dtype, device, draft_head, config.vocab_limit,
            draft_tokens=config.draft_tokens if cuda_graph else None, max_batch=layout.lanes,
        )  # fmt: skip
        drafter = mtp
    # DFlash reads the target's layer outputs through forward hooks, which graph replays skip
    graphable = not isinstance(drafter, DFlashEngineDrafter)
    return SpecDecoder(kv, states, drafter, config.draft_tokens, scratch, device, graphable)
