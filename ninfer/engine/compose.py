"""Composition root: the engine's model, narrow config and detokenizer from `Settings` + artifact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ninfer.artifact.registry import sampler_preset
from ninfer.engine.config import EngineConfig
from ninfer.engine.sampler import SamplingOverrides
from ninfer.engine.spec.draft_head import DraftHead
from ninfer.engine.spec.load import load_spec_weights, spec_fields
from ninfer.engine.stops import Detokenizer
from ninfer.kernels.dispatch import get_ops
from ninfer.model.weights import load_model
from ninfer.text.detok import IncrementalDetokenizer
from ninfer.text.tokenizer import Tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def engine_config(
    settings: Any, artifact: Any, device: str, dtype: str, vocab_limit: int | None = None
) -> EngineConfig:
    """Map the `engine`, `kv`, `sampling`, `spec` and `cold_tier` settings groups onto `EngineConfig`."""
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
        thinking_preset=sampler_preset(artifact.model_id, artifact.family, True),
        non_thinking_preset=sampler_preset(artifact.model_id, artifact.family, False),
        vocab_limit=vocab_limit,
        # "bf16" is the contract's default and means the model's own dtype (fp32 on a CPU run)
        kv_dtype="int8" if settings.kv.dtype == "int8" else None,
        **spec_fields(settings.spec),
        **cold_tier_fields(settings),
    )


def cold_tier_fields(settings: Any) -> dict[str, Any]:
    """The `cold_tier` settings group as `EngineConfig` fields (absent group: the defaults)."""
    ct = getattr(settings, "cold_tier", None)
    if ct is None:
        return {}
    return {
        "cold_tier": ct.enabled,
        "cold_tier_device": ct.device,
        "cold_tier_capacity_mib": ct.capacity_mib,
        "cold_tier_staging_mib": ct.staging_mib,
    }


def engine_parts(
    settings: Any, artifact: Any
) -> tuple[Any, EngineConfig, Callable[[], Detokenizer], DraftHead | None]:
    """Load the text model (plus, with --spec mtp, the MTP head and optional proposal head) on the
    configured device and dtype; build the config and detokenizer."""
    es = settings.engine
    device = es.torch_device(torch.cuda.is_available())
    dtype = es.torch_dtype(device != "cpu")
    backend = None if es.kernel_backend == "auto" else es.kernel_backend
    ops = get_ops(torch.device(device).type, backend)
    # straight to the device: one tensor at a time from the file map (synthetic weights are drawn there)
    tensors = artifact.load_tensors("text", device=device)
    model = load_model(artifact.config, tensors, _DTYPES[dtype], device, ops=ops)
    del tensors
    draft_head = load_spec_weights(settings.spec, artifact, model, _DTYPES[dtype], device)
    tokenizer = Tokenizer.from_file(artifact.tokenizer_path)
    config = engine_config(settings, artifact, device, dtype, vocab_limit=tokenizer.vocab_size)
    return model, config, lambda: IncrementalDetokenizer(tokenizer), draft_head


def vision_tower(artifact: Any, config: EngineConfig) -> torch.nn.Module:
    """The artifact's `vision` component as a tower on the engine's device and dtype (--vision only)."""
    from ninfer.model.vision import VisionConfig, load_vision_tower

    vision_cfg = artifact.config.vision
    if vision_cfg is None or not artifact.has_component("vision"):
        raise ValueError(f"{artifact.path}: vision is enabled but the artifact carries no vision tower")
    tensors = artifact.load_tensors("vision")
    return load_vision_tower(VisionConfig.from_hf(vision_cfg), tensors, _DTYPES[config.dtype], config.device)
