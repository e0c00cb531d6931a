"""The composition root: `Settings` + an opened artifact -> a built `Engine`.

The only module that joins the artifact (weights, tokenizer, components) with the engine and
maps `Settings` onto `EngineConfig`; the service, the benchmarks, scripts and the offline `LLM`
build engines here, and the engine receives built parts (the model, its narrow `EngineConfig`, a
detokenizer factory, the speculative heads, the vision tower and the grammar compiler). Without it the engine would import `artifact` and `text`, against the
layer rule of docs/structure.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ninfer.artifact.reader import Artifact
from ninfer.artifact.registry import sampler_preset
from ninfer.config import Settings
from ninfer.config.groups import ColdTierSettings, SpecSettings
from ninfer.engine.config import DEFAULT_DRAFT_TOKENS, EngineConfig, SamplingOverrides
from ninfer.engine.engine import Engine
from ninfer.engine.grammar import Grammars
from ninfer.engine.speculative.build import Drafters
from ninfer.engine.speculative.draft_head import DraftHead
from ninfer.engine.stops import Detokenizer
from ninfer.engine.types import EngineConfigError
from ninfer.kernels.dispatch import get_ops
from ninfer.model.dflash import DFlashDrafter
from ninfer.model.qwen35 import Qwen35Model
from ninfer.model.weights import load_model
from ninfer.text.detok import IncrementalDetokenizer
from ninfer.text.tokenizer import Tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def unsupported_formats(artifact: Artifact, capability: tuple[int, int] | None) -> str | None:
    """Why the GPU of `capability` (None: the CPU) cannot run the artifact's weight formats, or None."""
    from ninfer.kernels.support import unsupported

    return unsupported({s.fmt for specs in artifact.quantized.values() for s in specs.values()}, capability)


def build_engine(settings: Settings, artifact: Artifact) -> Engine:
    """Load the artifact's text model (and what --spec and --vision need) and build the engine."""
    model, config, detok, drafters = engine_parts(settings, artifact)
    grammars = Grammars(artifact.tokenizer_path, model.config.vocab_size, set(model.config.eos_token_ids))
    vision = vision_tower(artifact, config) if settings.vision.enabled else None
    return Engine(
        model, config, detok, drafters.draft_head, vision, grammars=grammars, dflash=drafters.dflash
    )


def engine_for_model(settings: Settings, model: Qwen35Model, tokenizer: Tokenizer | None = None) -> Engine:
    """An engine over a text model already loaded (the offline `LLM`), on the model's device and
    dtype: no sampler presets (neutral sampling), speculative heads, vision tower or grammar
    compiler; without a tokenizer its outputs carry token ids only."""
    if settings.spec.method is not None or settings.vision.enabled:
        raise EngineConfigError(
            "spec.method and vision.enabled need the artifact's components: build the engine with build_engine"
        )
    dtype = str(model.dtype).removeprefix("torch.")
    vocab_limit = tokenizer.vocab_size if tokenizer is not None else None
    config = engine_config(settings, None, str(model.device), dtype, vocab_limit=vocab_limit)
    if tokenizer is not None:
        config = replace(config, **think_close_fields(tokenizer))
    return Engine(model, config, detokenizer_factory(tokenizer) if tokenizer is not None else None)


def detokenizer_factory(tokenizer: Tokenizer) -> Callable[[], Detokenizer]:
    """One incremental detokenizer per request over `tokenizer`."""
    return lambda: IncrementalDetokenizer(tokenizer)


def engine_config(
    settings: Settings, artifact: Artifact | None, device: str, dtype: str, vocab_limit: int | None = None
) -> EngineConfig:
    """Map the `engine`, `kv`, `sampling`, `spec` and `cold_tier` settings groups onto `EngineConfig`,
    with the artifact's sampler presets."""
    es, ss = settings.engine, settings.sampling
    return EngineConfig(
        max_concurrency=es.max_concurrency,
        max_pending=es.max_pending_requests,
        pending_timeout_ms=es.pending_timeout_ms,
        prefill_chunk=es.prefill_chunk,
        max_context=es.max_context,
        kv_capacity=settings.kv.capacity,
        no_prefix_reuse=es.no_prefix_reuse,
        no_cuda_graph=es.no_cuda_graph,
        default_max_tokens=es.default_max_tokens,
        device=device,
        dtype=dtype,
        sampling=SamplingOverrides(
            temperature=ss.temperature,
            top_p=ss.top_p,
            top_k=ss.top_k,
            min_p=ss.min_p,
            presence_penalty=ss.presence_penalty,
            frequency_penalty=ss.frequency_penalty,
            seed=ss.seed,
            greedy=ss.greedy,
        ),
        vocab_limit=vocab_limit,
        default_thinking_budget=ss.default_thinking_budget,
        # "bf16" is the contract's default and means the model's own dtype (fp32 on a CPU run)
        kv_dtype="int8" if settings.kv.dtype == "int8" else None,
        **preset_fields(artifact),
        **spec_fields(settings.spec),
        **cold_tier_fields(settings.cold_tier),
    )


def preset_fields(artifact: Artifact | None) -> dict[str, Any]:
    """The artifact's registered sampler presets by thinking mode; none (neutral sampling) without one."""
    if artifact is None:
        return {}
    return {
        "thinking_preset": sampler_preset(artifact.sampler_model_id, artifact.family, True),
        "non_thinking_preset": sampler_preset(artifact.sampler_model_id, artifact.family, False),
    }


def spec_fields(spec: SpecSettings) -> dict[str, Any]:
    """`SpecSettings` -> the EngineConfig speculative fields."""
    if spec.method is None:
        return {}
    k = spec.draft_tokens if spec.draft_tokens is not None else DEFAULT_DRAFT_TOKENS
    return {"spec_method": spec.method, "draft_tokens": k, "lm_head_draft": spec.lm_head_draft}


def cold_tier_fields(ct: ColdTierSettings) -> dict[str, Any]:
    """The `cold_tier` settings group as `EngineConfig` fields."""
    return {
        "cold_tier": ct.enabled,
        "cold_tier_device": ct.device,
        "cold_tier_capacity_mib": ct.capacity_mib,
        "cold_tier_staging_mib": ct.staging_mib,
        "cold_tier_host_mib": ct.host_mib,
    }


def engine_parts(
    settings: Settings, artifact: Artifact
) -> tuple[Qwen35Model, EngineConfig, Callable[[], Detokenizer], Drafters]:
    """Load the text model (plus, with --spec, the MTP head and optional proposal head or the
    DFlash drafter) on the configured device and dtype; build the config and detokenizer."""
    es = settings.engine
    device = es.torch_device(torch.cuda.is_available())
    dtype = es.torch_dtype(device != "cpu")
    backend = None if es.kernel_backend == "auto" else es.kernel_backend
    ops = get_ops(torch.device(device).type, backend)
    # straight to the device: one tensor at a time from the file map (synthetic weights are drawn there)
    tensors = artifact.load_tensors("text", device=device)
    model = load_model(artifact.config, tensors, _DTYPES[dtype], device, ops=ops, consume=True)
    del tensors
    drafters = load_spec_weights(settings.spec, artifact, model, _DTYPES[dtype], device)
    tokenizer = Tokenizer.from_file(artifact.tokenizer_path)
    config = engine_config(settings, artifact, device, dtype, vocab_limit=tokenizer.vocab_size)
    return model, replace(config, **think_close_fields(tokenizer)), detokenizer_factory(tokenizer), drafters


THINK_CLOSE = "\n</think>\n\n"  # how the official templates close a turn's reasoning


def think_close_fields(tokenizer: Tokenizer) -> dict[str, Any]:
    """The end of thinking as the templates render it, in the tokenizer's ids (thinking budgets)."""
    return {
        "think_close": tuple(tokenizer.encode(THINK_CLOSE)),
        "think_end_id": tokenizer.token_to_id("</think>"),
    }


def load_spec_weights(
    spec: SpecSettings, artifact: Artifact, model: Qwen35Model, dtype: torch.dtype, device: str | torch.device
) -> Drafters:
    """Load what --spec needs: the MTP head into `model` (spec.method == "mtp") and the proposal
    head if asked, or the DFlash drafter (spec.method == "dflash"), both returned for the engine;
    nothing without --spec (residency is frozen at startup)."""
    if spec.method is None:
        return Drafters()
    if spec.method == "dflash":
        if spec.lm_head_draft:
            raise EngineConfigError("spec.lm_head_draft applies to spec mtp only, not dflash")
        return Drafters(dflash=load_dflash_drafter(artifact, dtype, device))
    from ninfer.model.weights import load_mtp

    if not artifact.has_component("mtp"):
        raise EngineConfigError("spec.method=mtp: this artifact carries no MTP head")
    load_mtp(artifact.config, artifact.load_tensors("mtp", device=device), model, dtype, device)
    if not spec.lm_head_draft:
        return Drafters()
    if not artifact.has_component("lm_head_draft"):
        raise EngineConfigError(
            "spec.lm_head_draft: this artifact has no 'lm_head_draft' component "
            "(add one with `python -m ninfer.artifact lm-head-draft`)"
        )
    cfg = artifact.config
    head = DraftHead.from_tensors(
        artifact.load_tensors("lm_head_draft"), cfg.vocab_size, cfg.hidden_size, dtype, device, model.ops
    )
    return Drafters(draft_head=head)


def load_dflash_drafter(artifact: Artifact, dtype: torch.dtype, device: str | torch.device) -> DFlashDrafter:
    """The artifact's `dflash` component as a drafter on `device`."""
    from ninfer.artifact.dflash import COMPONENT
    from ninfer.model.dflash import load_dflash

    if not artifact.has_component(COMPONENT):
        raise EngineConfigError(
            "spec.method=dflash: this artifact carries no DFlash drafter "
            "(add one with `python -m ninfer.artifact add-dflash ARTIFACT DRAFTER_HF_DIR`)"
        )
    try:
        cfg = artifact.dflash_config()
        return load_dflash(cfg, artifact.load_tensors(COMPONENT), dtype, device)
    except ValueError as exc:
        raise EngineConfigError(f"spec.method=dflash: {exc}") from None


def vision_tower(artifact: Artifact, config: EngineConfig) -> torch.nn.Module:
    """The artifact's `vision` component as a tower on the engine's device and dtype (--vision only)."""
    from ninfer.model.vision import VisionConfig, load_vision_tower

    vision_cfg = artifact.config.vision
    if vision_cfg is None or not artifact.has_component("vision"):
        raise ValueError(f"{artifact.path}: vision is enabled but the artifact carries no vision tower")
    tensors = artifact.load_tensors("vision")
    return load_vision_tower(VisionConfig.from_hf(vision_cfg), tensors, _DTYPES[config.dtype], config.device)
