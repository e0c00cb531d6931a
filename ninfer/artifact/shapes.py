"""Canonical tensor names and the shapes a TextConfig implies for the `text` and `mtp` components."""

from __future__ import annotations

from ninfer.model.config import FULL, TextConfig

Shape = tuple[int, ...]


def _ffn(c: TextConfig, p: str) -> dict[str, Shape]:
    """FFN tensors of one decoder layer under prefix `p` (ending in '.')."""
    h = c.hidden_size
    if not c.is_moe:
        i = int(c.intermediate_size or 0)
        return {
            f"{p}mlp.gate_proj.weight": (i, h),
            f"{p}mlp.up_proj.weight": (i, h),
            f"{p}mlp.down_proj.weight": (h, i),
        }
    e, ie = int(c.num_experts or 0), int(c.moe_intermediate_size or 0)
    s = int(c.shared_expert_intermediate_size or 0)
    return {
        f"{p}mlp.gate.weight": (e, h),
        f"{p}mlp.experts.gate_up_proj": (e, 2 * ie, h),  # [gate rows ; up rows]
        f"{p}mlp.experts.down_proj": (e, h, ie),
        f"{p}mlp.shared_expert.gate_proj.weight": (s, h),
        f"{p}mlp.shared_expert.up_proj.weight": (s, h),
        f"{p}mlp.shared_expert.down_proj.weight": (h, s),
        f"{p}mlp.shared_expert_gate.weight": (1, h),
    }


def _attention(c: TextConfig, p: str) -> dict[str, Shape]:
    h, hd = c.hidden_size, c.head_dim
    nh, nkv = c.num_attention_heads, c.num_key_value_heads
    return {
        f"{p}self_attn.q_proj.weight": (2 * nh * hd, h),  # per head [query ; output gate]
        f"{p}self_attn.k_proj.weight": (nkv * hd, h),
        f"{p}self_attn.v_proj.weight": (nkv * hd, h),
        f"{p}self_attn.o_proj.weight": (h, nh * hd),
        f"{p}self_attn.q_norm.weight": (hd,),
        f"{p}self_attn.k_norm.weight": (hd,),
    }


def _gdn(c: TextConfig, p: str) -> dict[str, Shape]:
    h, nv = c.hidden_size, c.linear_num_value_heads
    return {
        f"{p}linear_attn.in_proj_qkv.weight": (c.conv_dim, h),
        f"{p}linear_attn.in_proj_z.weight": (c.value_dim, h),
        f"{p}linear_attn.in_proj_b.weight": (nv, h),
        f"{p}linear_attn.in_proj_a.weight": (nv, h),
        f"{p}linear_attn.conv1d.weight": (c.conv_dim, 1, c.linear_conv_kernel_dim),
        f"{p}linear_attn.dt_bias": (nv,),
        f"{p}linear_attn.A_log": (nv,),
        f"{p}linear_attn.norm.weight": (c.linear_value_head_dim,),
        f"{p}linear_attn.out_proj.weight": (h, c.value_dim),
    }


def _layer(c: TextConfig, p: str, full: bool) -> dict[str, Shape]:
    h = c.hidden_size
    out = {f"{p}input_layernorm.weight": (h,), f"{p}post_attention_layernorm.weight": (h,)}
    out.update(_attention(c, p) if full else _gdn(c, p))
    out.update(_ffn(c, p))
    return out


def text_shapes(c: TextConfig) -> dict[str, Shape]:
    """Every tensor of the `text` component with its shape (canonical names: without `language_model.`)."""
    h = c.hidden_size
    out: dict[str, Shape] = {"model.embed_tokens.weight": (c.vocab_size, h)}
    for i, kind in enumerate(c.layer_types):
        out.update(_layer(c, f"model.layers.{i}.", kind == FULL))
    out["model.norm.weight"] = (h,)
    out["lm_head.weight"] = (c.vocab_size, h)
    return out


def mtp_shapes(c: TextConfig) -> dict[str, Shape]:
    """Every tensor of the `mtp` component; empty when the config has no MTP layer."""
    if c.mtp_num_hidden_layers <= 0:
        return {}
    h = c.hidden_size
    out: dict[str, Shape] = {
        "mtp.fc.weight": (h, 2 * h),  # input is cat[embedding, hidden]
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,),
        "mtp.norm.weight": (h,),
    }
    for i in range(c.mtp_num_hidden_layers):
        out.update(_layer(c, f"mtp.layers.{i}.", True))
    return out


def expected_shapes(c: TextConfig, component: str) -> dict[str, Shape] | None:
    """Names and shapes of a component, or None for components whose shapes are not derived here."""
    if component == "text":
        return text_shapes(c)
    if component == "mtp":
        return mtp_shapes(c)
    return None


def with_splits(
    c: TextConfig, want: dict[str, Shape], names: set[str] | dict[str, object]
) -> dict[str, Shape]:
    """`want` with each splittable tensor replaced by its parts where `names` holds the parts (a
    quantized artifact whose parts take two formats: `ninfer.model.layout`)."""
    from ninfer.model.layout import split_parts

    out: dict[str, Shape] = {}
    for name, shape in want.items():
        rows = split_parts(c, name)
        if rows is not None and all(p in names for p in rows):
            out.update({p: (r, shape[1]) for p, r in rows.items()})
        else:
            out[name] = shape
    return out
