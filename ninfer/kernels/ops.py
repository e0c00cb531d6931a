"""The op set the model calls (`Ops`): a leaf, so a backend module can build one without
importing the dispatch table that imports it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ninfer.kernels import moe_ref, norm_ref, quant_ref


@dataclass(frozen=True)
class Ops:
    """The op set the model calls. Every backend provides all of them (falling back to the reference)."""

    name: str
    # (q, k, v, g, beta, initial_state, chunk=64) -> (o [B,T,nv,dv], final_state [B,nv,dk,dv] fp32)
    chunk_gated_delta_rule: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    # (q, k, v, g, beta, initial_state) -> (o, final_state)
    recurrent_gated_delta_rule: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    # (x [B,T,C], weight [C,K], conv_state [B,C,K-1]) -> (y [B,T,C], new_state [B,C,K-1])
    causal_conv1d_with_state: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    # in place over slot pools, per-token state writes (decode, speculative verify):
    # (q, k [N,T,nk,dk], v [N,T,nv,dv], a, b [N,T,nv] raw, A_log, dt_bias [nv],
    #  ssm_pool [S,nv,dk,dv] fp32, slot_idx [N,T], start_slot [N]) -> o [N,T,nv,dv]
    # state read from start_slot[n], state after token t written to slot_idx[n,t]; < 0 skipped
    gdn_step: Callable[..., torch.Tensor]
    # (x [N,T,C], weight [C,K], conv_pool [S,C,K-1], slot_idx [N,T], start_slot [N]) -> y [N,T,C]
    conv_step: Callable[..., torch.Tensor]
    # (k_pool, v_pool, k [B,q,nkv,hd], v, page_table, cache_lens, k_scale=None, v_scale=None)
    # -> None (in place; int8 pools quantise per token and head into the scales [P,page,nkv])
    write_kv: Callable[..., None]
    # (q [B,q,nh,hd], k_pool, v_pool, page_table, cache_lens, scale, max_kv_len=None,
    #  k_scale=None, v_scale=None) -> o [B,q,nh,hd]
    paged_attention: Callable[..., torch.Tensor]
    # (x [N,H], gate_up [E,2Ie,H], down [E,H,Ie], topk_idx [N,k], topk_w [N,k]) -> [N,H]
    # (gate_up, down: dense tensors or QuantWeights)
    moe_experts: Callable[..., torch.Tensor]
    # the small ops around them (defaults: the torch code of `norm_ref` / `moe_ref`; a backend
    # fuses each into one launch). Inputs may be strided views with a contiguous last dim.
    # (x [...,D], weight [D], eps) -> (x * rsqrt(mean x^2 + eps)) * (1 + w)
    rms_norm: Callable[..., torch.Tensor] = norm_ref.rms_norm
    # (x, r [...,D], weight, eps) -> (h = x + r, rms_norm(h))
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]] = norm_ref.add_rms_norm
    # (x, z [...,D], weight, eps) -> (w * norm(x)) * silu(z)   (GDN output norm)
    gated_rms_norm: Callable[..., torch.Tensor] = norm_ref.gated_rms_norm
    # (x [B,q,heads,hd], weight [hd], eps, cos, sin [B,q,rot]) -> rope(rms_norm(x))   (q/k norm)
    norm_rope: Callable[..., torch.Tensor] = norm_ref.norm_rope
    # (o [B,q,nh,hd], gate [B,q,nh,hd]) -> o * sigmoid(gate) as [B,q,nh*hd]
    sigmoid_gate: Callable[..., torch.Tensor] = norm_ref.sigmoid_gate
    # (gate, up [...,I]) -> silu(gate) * up
    silu_mul: Callable[..., torch.Tensor] = norm_ref.silu_mul
    # (routed [N,H], gate_logit [N,1], shared [N,H]) -> routed + sigmoid(gate_logit) * shared
    shared_expert_add: Callable[..., torch.Tensor] = norm_ref.shared_expert_add
    # (router logits [N,E], k) -> (topk_idx [N,k] int64, topk_w [N,k] renormalised, logits' dtype)
    moe_route: Callable[..., tuple[torch.Tensor, torch.Tensor]] = moe_ref.route
    # (x [...,K], weight [N,K]) -> x @ weight.T [...,N] in x's dtype (every projection; a backend
    # may use its own kernel for few rows, e.g. decode's memory-bound GEMV)
    linear: Callable[..., torch.Tensor] = torch.nn.functional.linear
    # (gate_up [...,2I] = gate | up, weight [N,I]) -> silu_mul(gate, up) @ weight.T [...,N] (the MLP's
    # activation and down projection; a backend may fold the activation into its GEMV's x load)
    swiglu_linear: Callable[..., torch.Tensor] = norm_ref.swiglu_linear
    # (x [...,K], weight: QuantWeight [N,K]) -> x @ dequant(weight).T [...,N] in x's dtype (every
    # projection over a quantized weight; a backend reads the packed codes and scales directly)
    qlinear: Callable[..., torch.Tensor] = quant_ref.qlinear
    # (weights: list of the QuantWeights prefill chunks multiply, dtype) -> None: what a backend
    # prepares for them before any step is captured (the triton one: its dequantization scratch)
    reserve_quantized: Callable[..., None] = quant_ref.reserve_nothing
