"""Which projections an artifact may store split into parts (no torch: artifact inspection reads it).

A quantized artifact whose recipe gives a projection's rows two formats stores the parts:
attention q_proj (per head [query | output gate], interleaved) as `query_proj` and `gate_proj`
(de-interleaved), GDN in_proj_qkv ([q | k | v]) as `in_proj_qk` and `in_proj_v`."""

from __future__ import annotations

from ninfer.model.config import TextConfig

SPLIT_Q = ("self_attn.q_proj.weight", ("self_attn.query_proj.weight", "self_attn.gate_proj.weight"))
SPLIT_QKV = (
    "linear_attn.in_proj_qkv.weight",
    ("linear_attn.in_proj_qk.weight", "linear_attn.in_proj_v.weight"),
)
SPLITS = (SPLIT_Q, SPLIT_QKV)


def split_parts(config: TextConfig, whole: str) -> dict[str, int] | None:
    """A splittable tensor's parts: full name -> rows; None when `whole` does not split."""
    for suffix, parts in SPLITS:
        if whole.endswith(suffix):
            prefix = whole.removesuffix(suffix)
            if suffix == SPLIT_Q[0]:
                rows = [config.num_attention_heads * config.head_dim] * 2
            else:
                rows = [2 * config.key_dim, config.value_dim]
            return {prefix + p: r for p, r in zip(parts, rows, strict=True)}
    return None
