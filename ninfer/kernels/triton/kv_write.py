"""Paged K/V write for float pools in one launch (Triton): slot lookup, both pools, strided inputs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton import pdl
from ninfer.kernels.triton._checks import check_devices, check_int_index
from ninfer.kernels.triton.pdl import pdl_enter


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kp_ptr, vp_ptr, table_ptr, lens_ptr,  # k, v [B, q, nkv, hd]; pools [P, PAGE, nkv, hd]
    Q, HD,
    s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
    s_pp, s_pr, s_ph, s_qp, s_qr, s_qh,  # k pool, v pool strides (page, row, head)
    s_tb,
    PAGE: tl.constexpr,
    BD: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
    bt = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    b, t = bt // Q, bt % Q
    pos = tl.load(lens_ptr + b).to(tl.int64) + t
    page = tl.load(table_ptr + b * s_tb + pos // PAGE).to(tl.int64)
    row = pos % PAGE
    offs = tl.arange(0, BD)
    mask = (offs < HD) & (page >= 0)
    page = tl.maximum(page, 0)
    k = tl.load(k_ptr + b * s_kb + t * s_kt + h * s_kh + offs, mask=mask)
    v = tl.load(v_ptr + b * s_vb + t * s_vt + h * s_vh + offs, mask=mask)
    tl.store(kp_ptr + page * s_pp + row * s_pr + h * s_ph + offs, k.to(kp_ptr.dtype.element_ty), mask=mask)
    tl.store(vp_ptr + page * s_qp + row * s_qr + h * s_qh + offs, v.to(vp_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    page_table: torch.Tensor,
    cache_lens: torch.Tensor,
) -> None:
    """`attention_ref.write_kv` for float pools: token t of row b goes to position cache_lens[b] + t.

    k_pool, v_pool: [num_pages, page, nkv, hd]; k, v: [B, q, nkv, hd] (last dim contiguous);
    page_table: [B, max_pages] int; cache_lens: [B] int. A -1 page entry is skipped (nothing written).
    """
    if k_pool.dtype == torch.int8:
        raise ValueError("int8 pools are written by kv_int8.write_kv_int8")
    b, q, nkv, hd = k.shape
    if v.shape != k.shape or k_pool.shape[2:] != (nkv, hd) or v_pool.shape != k_pool.shape:
        raise ValueError(
            f"k, v {tuple(k.shape)} do not fit pools {tuple(k_pool.shape)} / {tuple(v_pool.shape)}"
        )
    if page_table.dim() != 2 or page_table.shape[0] != b or cache_lens.shape != (b,):
        raise ValueError("page_table must be [B, max_pages] and cache_lens [B]")
    check_int_index("page_table", page_table)
    check_int_index("cache_lens", cache_lens)
    check_devices(k, v, k_pool, v_pool, page_table, cache_lens)
    for name, t in (("k", k), ("v", v), ("k_pool", k_pool), ("v_pool", v_pool)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim")
    page = k_pool.shape[1]
    if page & (page - 1):
        raise ValueError(f"page size {page} must be a power of two")
    if b * q == 0:
        return
    _write_kv_kernel[(b * q, nkv)](
        k, v, k_pool, v_pool, page_table, cache_lens, q, hd,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        page_table.stride(0), PAGE=page, BD=triton.next_power_of_2(hd), num_warps=1 if hd <= 128 else 2,
        **pdl.launch(k),
    )  # fmt: skip
