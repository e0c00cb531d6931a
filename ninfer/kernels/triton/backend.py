"""The "triton" kernel backend (CUDA): Triton decode/verify kernels, fla chunked prefill, grouped MoE.

Per phase (what `ninfer.model` calls):
* GDN, q <= the step threshold or per-token slots (decode, verify): `gdn_decode_step` and
  `conv_step`, in place on the slot pools (no gather/scatter, no host sync).
* GDN prefill: `fla.ops.gated_delta_rule.chunk_gated_delta_rule` (fla-core, when importable;
  else the torch reference chunked rule, logged once) with the torch conv.
* Attention: Triton `paged_attention` for decode / verify / multi-sequence calls (float or int8
  pools); a single sequence's chunk of >= 64 tokens gathers its pages once and runs torch SDPA
  (flash) with a lower-right causal mask (`prefill_attention`); K/V writes in one Triton
  launch for float pools (int8: quantised on write by torch ops).
* MoE experts: for <= 384 (token, expert) rows of <= 64 tokens (decode, verify) two Triton
  launches that read each distinct expert once (`moe.moe_experts_small`); above,
  `torch._grouped_mm` after a sort by expert when it runs on this device and dtype (bf16,
  sm_90+), else the reference loop. Router: one Triton launch.
* Norms (1+w, residual add + norm, gated, q/k norm + rope) and the gated products around them
  (attention output gate, SwiGLU, shared-expert add): one Triton launch each (`norms`, `gates`).
* Projections: the GEMV for few rows where it beats cuBLAS (`gemv.use_gemv`), else F.linear; the
  MLP's SwiGLU folds into its down projection's GEMV where the GEMV takes that projection.
  Quantized weights (`Ops.qlinear`): the quantized GEMV reading codes and scales for <= 64 rows
  (`qgemv`), else the weight dequantized into a reused scratch and F.linear (`dequant`); quantized
  expert banks the same way (`moe_qkernels` for few rows, dequantized banks + grouped GEMMs above).
Every Triton op is called through its `torch.library` custom op (`library`), so torch.compile
keeps it as one opaque node.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from ninfer.formats import QuantWeight
from ninfer.kernels import conv_ref, gdn_ref, moe_ref
from ninfer.kernels.moe_grouped import moe_experts_grouped
from ninfer.kernels.ops import Ops
from ninfer.kernels.triton import dequant, gemv, moe, prefill_attention
from ninfer.kernels.triton import library as lib
from ninfer.kernels.triton.gdn_decode import recurrent_gated_delta_rule as triton_recurrent
from ninfer.kernels.triton.kv_int8 import write_kv_int8

log = logging.getLogger(__name__)

# one compile per T (decode, verify, prefill buckets); longer calls use the torch reference
CONV_STEP_MAX_T = 64


def fla_chunk_rule() -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
    """fla's `chunk_gated_delta_rule` wrapped to our contract, or None when fla does not import."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    except ImportError as err:
        return _log_none(f"fla (fla-core) does not import ({err})")

    def chunk_gated_delta_rule(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        initial_state: torch.Tensor | None = None,
        chunk: int = 64,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`gdn_ref.chunk_gated_delta_rule`'s contract: q, k [B,T,nk,dk] raw (fla l2-normalises them
        in kernel, eps inside the sum, and scales q by dk^-0.5), v [B,T,nv,dv], g natural-log decay
        [B,T,nv], beta post-sigmoid [B,T,nv]; state [B,nv,dk,dv] fp32 in and out."""
        init = None if initial_state is None else initial_state.to(torch.float32).contiguous()
        o, final = fla_chunk(
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            g=g.to(torch.float32).contiguous(),
            beta=beta.contiguous(),  # keyword: fla's positional order differs between its ops
            initial_state=init,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            chunk_size=chunk,
        )
        return o.to(v.dtype), final

    return chunk_gated_delta_rule


def _log_none(why: str) -> None:
    log.warning("%s: GDN prefill uses the torch reference chunked rule", why)
    return None


def _conv_step(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_pool: torch.Tensor,
    slot_idx: torch.Tensor,
    start_slot: torch.Tensor,
) -> torch.Tensor:
    if x.shape[1] > CONV_STEP_MAX_T:
        return conv_ref.conv_step(x, weight, conv_pool, slot_idx, start_slot)
    return lib.conv_step(x, weight, conv_pool, slot_idx, start_slot)


def _write_kv(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    page_table: torch.Tensor,
    cache_lens: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    if k_pool.dtype == torch.int8:
        if k_scale is None or v_scale is None:
            raise ValueError("int8 KV pools need k_scale and v_scale [num_pages, page, nkv]")
        write_kv_int8(k_pool, v_pool, k_scale, v_scale, k, v, page_table, cache_lens)
    else:
        lib.write_kv(k_pool, v_pool, k, v, page_table, cache_lens)


def _paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float,
    max_kv_len: int | None = None,  # the kernel bounds each sequence by its own length
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    if prefill_attention.applies(q, max_kv_len):  # long single-sequence chunk: gather + flash SDPA
        assert max_kv_len is not None
        return prefill_attention.prefill_attention(
            q, k_pool, v_pool, page_table, max_kv_len, scale, k_scale, v_scale
        )
    return lib.paged_attention(
        q.contiguous(), k_pool, v_pool, page_table, cache_lens, scale, k_scale, v_scale
    )


@functools.cache
def grouped_mm_works(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `torch._grouped_mm` runs and is right on this device and dtype (checked once, eagerly)."""
    if not hasattr(torch, "_grouped_mm") or device.type != "cuda":
        return False
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(24, 64, generator=gen).to(device, dtype)
        w = torch.randn(3, 32, 64, generator=gen).to(device, dtype)  # [E, N, K] like gate_up
        offs = torch.tensor([5, 5, 24], dtype=torch.int32, device=device)
        y = torch._grouped_mm(x, w.transpose(1, 2), offs=offs).float()
        ref = torch.cat([x[:5] @ w[0].T, x[5:] @ w[2].T]).float()
        ok = bool(torch.allclose(y, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item()))
    except (RuntimeError, NotImplementedError) as err:
        log.warning("torch._grouped_mm does not run for %s on %s: %s", dtype, device, err)
        return False
    if not ok:
        log.warning("torch._grouped_mm gave wrong results for %s on %s; not used", dtype, device)
    return ok


def moe_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor | QuantWeight,
    down: torch.Tensor | QuantWeight,
    topk_idx: torch.Tensor,
    topk_w: torch.Tensor,
) -> torch.Tensor:
    """`moe_ref.moe_experts`'s contract without host syncs where possible (see the module docstring).
    Quantized banks: the small path decodes them in its kernels; more rows dequantize both banks into
    the scratch and take the grouped GEMMs (or the reference loop)."""
    small = topk_idx.numel() <= moe.SMALL_MAX_ROWS and topk_idx.shape[0] <= moe.SMALL_MAX_TOKENS
    if isinstance(gate_up, QuantWeight) and isinstance(down, QuantWeight):
        if small:
            return lib.moe_experts_quantized_small(x, gate_up, down, topk_idx, topk_w)
        if not grouped_mm_works(x.device, x.dtype):
            return moe_ref.moe_experts(x, gate_up, down, topk_idx, topk_w)
        gu = dequant.dequantize(gate_up, x.dtype)
        dn = dequant.dequantize(down, x.dtype, offset=gate_up.rows * gate_up.k)
        return moe_experts_grouped(x, gu, dn, topk_idx, topk_w)
    if isinstance(gate_up, QuantWeight) or isinstance(down, QuantWeight):
        raise TypeError("an expert bank pair is both quantized or both dense")
    if small:
        return lib.moe_experts_small(x, gate_up, down, topk_idx, topk_w)
    if grouped_mm_works(x.device, x.dtype):
        return moe_experts_grouped(x, gate_up, down, topk_idx, topk_w)
    return moe_ref.moe_experts(x, gate_up, down, topk_idx, topk_w)


# Down weights up to this many elements take the fused GEMV. Every program of the GEMV recomputes
# the activation of its K range: on the H200 the 27B down projection (5120 x 17408, one row) ran
# 0.5 ms per step slower fused than the 64 launches it saved; the 35B-A3B shared expert's (2048 x 512)
# gained a little.
SWIGLU_FUSED_MAX_ELEMS = 1 << 22


def swiglu_linear(gate_up: torch.Tensor, weight: torch.Tensor | QuantWeight) -> torch.Tensor:
    """`Ops.swiglu_linear`: gate_up [..., 2I] (gate | up), weight [N, I] -> [..., N]. One GEMV launch
    with silu(gate) * up on its x load where `linear` would take the GEMV for these rows and the
    weight is small (`SWIGLU_FUSED_MAX_ELEMS`; bit-identical to the two launches), else the SwiGLU
    launch and `linear` (a quantized weight: the SwiGLU launch and `qlinear`)."""
    k = weight.shape[-1]
    if gate_up.shape[-1] != 2 * k:
        raise ValueError(f"gate_up {tuple(gate_up.shape)} is not gate | up for weight {tuple(weight.shape)}")
    gate, up = gate_up[..., :k], gate_up[..., k:]  # [..., I] views
    if isinstance(weight, QuantWeight):
        return lib.qlinear(lib.silu_mul(gate, up), weight)
    if weight.numel() <= SWIGLU_FUSED_MAX_ELEMS and gemv.use_gemv(gate, weight):
        return lib.swiglu_linear_op(gate_up, weight)
    return lib.linear(lib.silu_mul(gate, up), weight)


def reserve_quantized(weights: list[QuantWeight], dtype: torch.dtype) -> None:
    """Size the dequantization scratch before capture: the largest matrix, or the largest pair of
    expert banks (a prefill's MoE dequantizes gate_up and down together)."""
    if not weights:
        return
    mats = [w.rows * w.k for w in weights if len(w.shape) == 2]
    banks = sorted((w.rows * w.k for w in weights if len(w.shape) == 3), reverse=True)
    need = max(max(mats, default=0), sum(banks[:2]))
    dequant.reserve(need, weights[0].device, dtype)


def triton_ops() -> Ops:
    """The op set of the "triton" backend (see the module docstring)."""
    chunk = fla_chunk_rule()
    if torch.cuda.is_available():  # probe eagerly, never inside a CUDA-graph capture
        grouped_mm_works(torch.device("cuda", torch.cuda.current_device()), torch.bfloat16)
    if chunk is not None:
        log.info("kernel backend 'triton': GDN prefill through fla chunk_gated_delta_rule")
    return Ops(
        name="triton",
        chunk_gated_delta_rule=chunk or gdn_ref.chunk_gated_delta_rule,
        recurrent_gated_delta_rule=triton_recurrent,
        causal_conv1d_with_state=conv_ref.causal_conv1d_with_state,
        gdn_step=lib.gdn_step,
        conv_step=_conv_step,
        write_kv=_write_kv,
        paged_attention=_paged_attention,
        moe_experts=moe_experts,
        rms_norm=lib.rms_norm,
        add_rms_norm=lib.add_rms_norm,
        gated_rms_norm=lib.gated_rms_norm,
        norm_rope=lib.norm_rope,
        sigmoid_gate=lib.sigmoid_gate,
        silu_mul=lib.silu_mul,
        shared_expert_add=lib.shared_expert_add,
        moe_route=lib.moe_route,
        linear=lib.linear,
        swiglu_linear=swiglu_linear,
        qlinear=lib.qlinear,
        reserve_quantized=reserve_quantized,
    )
