"""The Triton ops as `torch.library` custom ops (namespace `ninfer`) with fake implementations.

torch.compile treats each as one opaque node (Inductor does not re-compile the Triton kernels
inside, Dynamo does not trace into them), so a whole decode step traces as one graph. Mutated
pools are declared in `mutates_args`; every output is a fresh tensor. Eager calls cost one
dispatcher round trip each, which CUDA-graph replay removes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ninfer.formats import QuantWeight, format_of
from ninfer.kernels.triton import dequant, gates, gemv, moe, norms, qgemv
from ninfer.kernels.triton.conv_step import conv_step as _conv_step
from ninfer.kernels.triton.gdn_decode import gdn_decode_step as _gdn_step
from ninfer.kernels.triton.kv_write import write_kv as _write_kv
from ninfer.kernels.triton.paged_attention import paged_attention as _paged_attention

_lib = torch.library


def _like(x: Tensor, shape: tuple[int, ...] | torch.Size | None = None) -> Tensor:
    return x.new_empty(x.shape if shape is None else shape)


@_lib.custom_op("ninfer::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return norms.rms_norm(x, weight, eps)


@rms_norm.register_fake
def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _like(x)


@_lib.custom_op("ninfer::add_rms_norm", mutates_args=())
def add_rms_norm(x: Tensor, r: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return norms.add_rms_norm(x, r, weight, eps)


@add_rms_norm.register_fake
def _(x: Tensor, r: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return _like(x), _like(x)


@_lib.custom_op("ninfer::gated_rms_norm", mutates_args=())
def gated_rms_norm(x: Tensor, z: Tensor, weight: Tensor, eps: float) -> Tensor:
    return norms.gated_rms_norm(x, z, weight, eps)


@gated_rms_norm.register_fake
def _(x: Tensor, z: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _like(x)


@_lib.custom_op("ninfer::norm_rope", mutates_args=())
def norm_rope(x: Tensor, weight: Tensor, eps: float, cos: Tensor, sin: Tensor) -> Tensor:
    return norms.norm_rope(x, weight, eps, cos, sin)


@norm_rope.register_fake
def _(x: Tensor, weight: Tensor, eps: float, cos: Tensor, sin: Tensor) -> Tensor:
    return _like(x)


@_lib.custom_op("ninfer::sigmoid_gate", mutates_args=())
def sigmoid_gate(o: Tensor, gate: Tensor) -> Tensor:
    return gates.sigmoid_gate(o, gate)


@sigmoid_gate.register_fake
def _(o: Tensor, gate: Tensor) -> Tensor:
    return _like(o, (o.shape[0], o.shape[1], o.shape[2] * o.shape[3]))


@_lib.custom_op("ninfer::silu_mul", mutates_args=())
def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    return gates.silu_mul(gate, up)


@silu_mul.register_fake
def _(gate: Tensor, up: Tensor) -> Tensor:
    return _like(gate)


@_lib.custom_op("ninfer::shared_expert_add", mutates_args=())
def shared_expert_add(routed: Tensor, gate_logit: Tensor, shared: Tensor) -> Tensor:
    return gates.shared_expert_add(routed, gate_logit, shared)


@shared_expert_add.register_fake
def _(routed: Tensor, gate_logit: Tensor, shared: Tensor) -> Tensor:
    return _like(routed)


@_lib.custom_op("ninfer::moe_route", mutates_args=())
def moe_route(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    return moe.moe_route(logits, k)


@moe_route.register_fake
def _(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    n = logits.shape[0]
    return logits.new_empty((n, k), dtype=torch.int64), _like(logits, (n, k))


@_lib.custom_op("ninfer::moe_experts_small", mutates_args=())
def moe_experts_small(x: Tensor, gate_up: Tensor, down: Tensor, topk_idx: Tensor, topk_w: Tensor) -> Tensor:
    return moe.moe_experts_small(x, gate_up, down, topk_idx, topk_w)


@moe_experts_small.register_fake
def _(x: Tensor, gate_up: Tensor, down: Tensor, topk_idx: Tensor, topk_w: Tensor) -> Tensor:
    return _like(x)


@_lib.custom_op("ninfer::gdn_step", mutates_args=("ssm",))
def gdn_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    ssm: Tensor,
    slot_idx: Tensor,
    start_slot: Tensor,
) -> Tensor:
    return _gdn_step(q, k, v, a, b, A_log, dt_bias, ssm, slot_idx, start_slot)


@gdn_step.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
      ssm: Tensor, slot_idx: Tensor, start_slot: Tensor) -> Tensor:  # fmt: skip
    return v.new_empty(v.shape)


@_lib.custom_op("ninfer::conv_step", mutates_args=("conv_pool",))
def conv_step(x: Tensor, weight: Tensor, conv_pool: Tensor, slot_idx: Tensor, start_slot: Tensor) -> Tensor:
    return _conv_step(x, weight, conv_pool, slot_idx, start_slot)


@conv_step.register_fake
def _(x: Tensor, weight: Tensor, conv_pool: Tensor, slot_idx: Tensor, start_slot: Tensor) -> Tensor:
    return x.new_empty(x.shape)


@_lib.custom_op("ninfer::write_kv", mutates_args=("k_pool", "v_pool"))
def write_kv(
    k_pool: Tensor, v_pool: Tensor, k: Tensor, v: Tensor, page_table: Tensor, cache_lens: Tensor
) -> None:
    _write_kv(k_pool, v_pool, k, v, page_table, cache_lens)


@write_kv.register_fake
def _(k_pool: Tensor, v_pool: Tensor, k: Tensor, v: Tensor, page_table: Tensor, cache_lens: Tensor) -> None:
    return None


@_lib.custom_op("ninfer::paged_attention", mutates_args=())
def paged_attention(
    q: Tensor,
    k_pool: Tensor,
    v_pool: Tensor,
    page_table: Tensor,
    cache_lens: Tensor,
    scale: float,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> Tensor:
    return _paged_attention(
        q, k_pool, v_pool, page_table, cache_lens, scale, k_scale=k_scale, v_scale=v_scale
    )


@paged_attention.register_fake
def _(q: Tensor, k_pool: Tensor, v_pool: Tensor, page_table: Tensor, cache_lens: Tensor, scale: float,
      k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Tensor:  # fmt: skip
    return q.new_empty(q.shape)


@_lib.custom_op("ninfer::gemv", mutates_args=())
def gemv_op(x: Tensor, weight: Tensor) -> Tensor:
    return gemv.gemv(x, weight)


@gemv_op.register_fake
def _(x: Tensor, weight: Tensor) -> Tensor:
    return _like(x, (*x.shape[:-1], weight.shape[0]))


@_lib.custom_op("ninfer::swiglu_linear", mutates_args=())
def swiglu_linear_op(gate_up: Tensor, weight: Tensor) -> Tensor:
    """The GEMV with the SwiGLU folded into its x load: silu(gate_up[..., :K]) * gate_up[..., K:] @ W^T."""
    return gemv.gemv(gate_up, weight, act="swiglu")


@swiglu_linear_op.register_fake
def _(gate_up: Tensor, weight: Tensor) -> Tensor:
    return _like(gate_up, (*gate_up.shape[:-1], weight.shape[0]))


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """`Ops.linear`: the Triton GEMV for <= gemv.MAX_ROWS rows on the GPU, else F.linear."""
    if gemv.use_gemv(x, weight):
        return gemv_op(x, weight)
    return torch.nn.functional.linear(x, weight)


def _weight(fmt: str, shape: list[int], base: Tensor, high: Tensor | None, scale: Tensor) -> QuantWeight:
    return QuantWeight(format_of(fmt), tuple(shape), base, high, scale)


@_lib.custom_op("ninfer::qgemv", mutates_args=())
def qgemv_op(x: Tensor, base: Tensor, high: Tensor | None, scale: Tensor, fmt: str, shape: list[int]) -> Tensor:
    """The quantized GEMV: x [..., K] @ dequant(W [N, K])^T for <= qgemv.MAX_ROWS rows."""
    return qgemv.qgemv(x, _weight(fmt, shape, base, high, scale))


@qgemv_op.register_fake
def _(x: Tensor, base: Tensor, high: Tensor | None, scale: Tensor, fmt: str, shape: list[int]) -> Tensor:
    return _like(x, (*x.shape[:-1], shape[0]))


def qlinear(x: Tensor, w: QuantWeight) -> Tensor:
    """`Ops.qlinear`: the quantized GEMV for <= qgemv.MAX_ROWS rows on the GPU, else the weight
    dequantized into the scratch (`dequant`) and F.linear."""
    m = x.numel() // max(1, x.shape[-1])
    if m <= qgemv.MAX_ROWS:
        return qgemv_op(x, w.base, w.high, w.scale, w.fmt.name, list(w.shape))
    return torch.nn.functional.linear(x, dequant.dequantize(w, x.dtype))


@_lib.custom_op("ninfer::moe_experts_small_q", mutates_args=())
def moe_experts_small_q(
    x: Tensor,
    gu_base: Tensor, gu_high: Tensor | None, gu_scale: Tensor, gu_fmt: str, gu_shape: list[int],
    dn_base: Tensor, dn_high: Tensor | None, dn_scale: Tensor, dn_fmt: str, dn_shape: list[int],
    topk_idx: Tensor, topk_w: Tensor,
) -> Tensor:  # fmt: skip
    """`moe.moe_experts_small_quantized` over the banks' planes."""
    gate_up = _weight(gu_fmt, gu_shape, gu_base, gu_high, gu_scale)
    down = _weight(dn_fmt, dn_shape, dn_base, dn_high, dn_scale)
    return moe.moe_experts_small_quantized(x, gate_up, down, topk_idx, topk_w)


@moe_experts_small_q.register_fake
def _(x: Tensor, *args: object) -> Tensor:
    return _like(x)


def moe_experts_quantized_small(
    x: Tensor, gate_up: QuantWeight, down: QuantWeight, topk_idx: Tensor, topk_w: Tensor
) -> Tensor:
    return moe_experts_small_q(
        x,
        gate_up.base, gate_up.high, gate_up.scale, gate_up.fmt.name, list(gate_up.shape),
        down.base, down.high, down.scale, down.fmt.name, list(down.shape),
        topk_idx, topk_w,
    )  # fmt: skip
