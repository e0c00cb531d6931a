"""The transformers `generate` baseline on the very same weights (shared storage), batch 1, greedy."""

from __future__ import annotations

import time
from typing import Any

import torch

from ninfer.model.qwen35 import Qwen35Model
from ops.bench.ceilings import sync
from ops.bench.shapes import random_prompt


def hf_decode_tok_s(model: Qwen35Model, shape: dict[str, Any], prompt_len: int, new_tokens: int) -> float:
    """Decode tokens/s of `generate` at batch 1: (n-1) tokens over (time for n) - (time for 1),
    each the fastest of three calls."""
    import transformers

    moe = shape["model_type"].startswith("qwen3_5_moe")
    cls_cfg = transformers.Qwen3_5MoeTextConfig if moe else transformers.Qwen3_5TextConfig
    cls_model = transformers.Qwen3_5MoeForCausalLM if moe else transformers.Qwen3_5ForCausalLM
    config = cls_cfg(**{k: v for k, v in shape.items() if k != "model_type"})
    if hasattr(config, "experts_implementation"):
        config.experts_implementation = "grouped_mm"
    with torch.device("meta"):
        ref = cls_model(config)
    sd = {
        ("model." + k if k != "lm_head.weight" else k): v
        for k, v in model.state_dict().items()
        if not k.startswith("mtp.")
    }
    ref.load_state_dict(sd, strict=True, assign=True)
    for mod in ref.modules():  # rebuild the non-persistent rotary buffers that stayed on meta
        if hasattr(mod, "inv_freq") and mod.inv_freq.is_meta:
            fresh = type(mod)(mod.config)  # built on the CPU: its __init__ computes the buffers
            mod.inv_freq = fresh.inv_freq
            mod.original_inv_freq = fresh.original_inv_freq
    dev = model.lm_head.weight.device
    ref.to(device=dev)
    ref.eval()
    ids = torch.tensor([random_prompt(prompt_len, 7, model.config.vocab_size)], device=dev)

    def timed(n: int) -> float:  # the fastest of three `generate` calls of n new tokens
        best = float("inf")
        for _ in range(3):
            sync(dev)
            t0 = time.perf_counter()
            ref.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n)
            sync(dev)
            best = min(best, time.perf_counter() - t0)
        return best

    with torch.inference_mode():
        ref.generate(ids, max_new_tokens=2, do_sample=False)  # warm-up
        one, many = timed(1), timed(new_tokens)
    if many > one:
        return (new_tokens - 1) / (many - one)
    # tiny models on a busy CPU: timing noise can swallow the decode steps; the whole call's rate
    # (prefill included) is then a lower bound rather than a negative number
    return new_tokens / many
