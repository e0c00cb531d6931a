"""Model shapes of the benchmarked checkpoints (and tiny smoke versions), random weights, cost models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ninfer.artifact.released import COMMON, RELEASED_SHAPES
from ninfer.kernels.dispatch import get_ops
from ninfer.model.config import TextConfig
from ninfer.model.mtp import MTPHead
from ninfer.model.qwen35 import Qwen35Model
from ninfer.model.weights import fuse_default

# Text-config shapes of the released checkpoints: one table, shared with `ninfer.artifact synth`.
SHAPES = RELEASED_SHAPES

# Smoke shapes: the same families (dense / MoE), 4 layers (3 GDN + 1 attention), a 512-id vocabulary.
_TINY: dict[str, Any] = dict(
    COMMON,
    vocab_size=512,
    head_dim=32,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    max_position_embeddings=4096,
    rope_parameters=dict(COMMON["rope_parameters"], mrope_section=[2, 1, 1]),  # rotary 8 -> 4 pairs
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
)
SMOKE_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3.6-27b": dict(_TINY, model_type="qwen3_5_text", intermediate_size=128),
    "qwen3.6-35b-a3b": dict(
        _TINY,
        model_type="qwen3_5_moe_text",
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    ),
}


def hf_shape(name: str, smoke: bool) -> dict[str, Any]:
    """The HF text config dict of model `name` (full size, or its smoke version)."""
    table = SMOKE_SHAPES if smoke else SHAPES
    if name not in table:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(table)}")
    return table[name]


def init_random_(module: torch.nn.Module, gen: torch.Generator) -> None:
    """N(0, 0.02) weights; norm offsets N(0, 0.1), A_log U(-1, 1), dt_bias N(0, 0.5). In place."""
    with torch.no_grad():
        for pname, p in module.named_parameters():
            if pname.endswith("A_log"):
                p.uniform_(-1.0, 1.0, generator=gen)
            elif "norm" in pname:
                p.normal_(0.0, 0.1, generator=gen)
            elif pname.endswith("dt_bias"):
                p.normal_(0.0, 0.5, generator=gen)
            else:
                p.normal_(0.0, 0.02, generator=gen)


def build_model(
    shape: dict[str, Any], backend: str, device: str, dtype: torch.dtype, weights: str = "bf16"
) -> Qwen35Model:
    """Model of `shape` with random weights drawn directly on `device` (no host copy of a full model).
    `weights`: a weight profile other than bf16 draws the profile's quantized planes (as a synthetic
    artifact of that profile loads) and loads them through the engine's loader."""
    cfg = TextConfig.from_hf(shape)
    if weights != "bf16":
        return _quantized_model(cfg, backend, device, dtype, weights)
    gen = torch.Generator(device=device).manual_seed(0)
    ops = get_ops(torch.device(device).type, backend)  # outside meta: backends probe kernels on the device
    with torch.device("meta"):
        model = Qwen35Model(cfg, ops)
    model = model.to_empty(device=device).to(dtype)
    init_random_(model, gen)
    model.init_buffers(device)
    model.eval().requires_grad_(False)
    if fuse_default(device):  # as the engine's loader does (fewer, larger GEMMs per layer)
        model.fuse_projections()
    return model


def _quantized_model(cfg: TextConfig, backend: str, device: str, dtype: torch.dtype, weights: str) -> Qwen35Model:
    import dataclasses
    import tempfile

    from ninfer.artifact import open_artifact, registry
    from ninfer.artifact.synth import write_synthetic
    from ninfer.model.weights import load_model

    ident = registry.lookup("qwen3.6-35b-a3b" if cfg.is_moe else "qwen3.6-27b")  # the profile's recipe
    assert ident is not None
    cfg = dataclasses.replace(cfg, mtp_num_hidden_layers=0)
    with tempfile.TemporaryDirectory() as tmp:
        art = open_artifact(
            write_synthetic(Path(tmp) / "bench.ninfer", cfg, ident, seed=0, label="bench", display="bench", weights=weights)
        )
        tensors = art.load_tensors("text", device=device)
    ops = get_ops(torch.device(device).type, backend)
    return load_model(art.config, tensors, dtype, device, ops=ops)


def attach_mtp(model: Qwen35Model, device: str, dtype: torch.dtype) -> MTPHead:
    """A random one-layer MTP head of the trunk's shapes, bound to its embedding/lm_head/rotary."""
    with torch.device("meta"):
        head = MTPHead(model.config, model.ops)
    head = head.to_empty(device=device).to(dtype)
    init_random_(head, torch.Generator(device=device).manual_seed(1))
    assert model.rotary is not None
    head.bind(model.embed_tokens, model.lm_head, model.rotary)
    head.eval().requires_grad_(False)
    if fuse_default(device):
        head.fuse_projections()
    model.mtp = head
    return head


def random_prompt(n: int, seed: int, vocab: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, min(vocab, 240_000), (n,), generator=g).tolist())


def _trunk_params(model: Qwen35Model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if not n.startswith("mtp.")]


def _trunk_weights(model: Qwen35Model) -> list[tuple[str, int, int, int]]:
    """(name, bytes, logical elements, rows) of every trunk weight, dense parameters and quantized
    planes alike (the MTP head excluded)."""
    from ninfer.formats import QuantWeight

    out = [(n, p.numel() * p.element_size(), p.numel(), p.shape[0] if p.dim() else 1) for n, p in _trunk_params(model)]
    for mname, m in model.named_modules():
        if mname.startswith("mtp"):
            continue
        for attr, v in vars(m).items():
            if isinstance(v, QuantWeight):
                numel = v.rows * v.k
                out.append((f"{mname}.{attr}".lstrip("."), v.nbytes, numel, v.shape[0]))
    return out


def weight_bytes_per_token(model: Qwen35Model) -> int:
    """Bytes of weights one decode step must read at batch 1 (embedding: one row; MoE: top-k experts)."""
    cfg = model.config
    total = 0
    for pname, nbytes, _, rows in _trunk_weights(model):
        if pname.startswith("embed_tokens"):
            nbytes = nbytes // rows
        elif ".experts." in pname and cfg.num_experts:
            nbytes = nbytes * cfg.num_experts_per_tok // cfg.num_experts
        total += nbytes
    return total


def bits_per_weight(model: Qwen35Model) -> float:
    """Stored bits per logical weight over the trunk's matrices (embedding and lm_head included)."""
    nbytes = elems = 0
    for pname, b, n, _ in _trunk_weights(model):
        if "norm" in pname or pname.endswith(("A_log", "dt_bias", "conv1d.weight")):
            continue
        nbytes, elems = nbytes + b, elems + n
    return 8 * nbytes / max(1, elems)


def state_bytes_per_token(cfg: TextConfig, context: int, kv_elem: int = 2) -> int:
    """KV bytes read + GDN recurrent state read and written (fp32) per sequence per step."""
    kv = len(cfg.attention_layers) * 2 * cfg.num_key_value_heads * cfg.head_dim * kv_elem * context
    ssm = len(cfg.linear_layers) * cfg.linear_num_value_heads * cfg.linear_key_head_dim
    return kv + ssm * cfg.linear_value_head_dim * 4 * 2


def prefill_flops_per_token(model: Qwen35Model, context: int) -> float:
    """2 x active non-embedding parameters + attention score/value FLOPs at average context/2."""
    cfg = model.config
    active = 0
    for pname, _, n, _ in _trunk_weights(model):
        if pname.startswith("embed_tokens"):
            continue
        if ".experts." in pname and cfg.num_experts:
            n = n * cfg.num_experts_per_tok // cfg.num_experts
        active += n
    attn = 4 * len(cfg.attention_layers) * cfg.num_attention_heads * cfg.head_dim * (context / 2)
    return 2 * active + attn
