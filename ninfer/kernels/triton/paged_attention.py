"""GQA attention of T new tokens over a paged KV pool (bf16/fp32 or int8 + per-token scales), split-K (Triton)."""

from __future__ import annotations

import functools

import torch
import triton

from ninfer.kernels.triton import pdl
from ninfer.kernels.triton._checks import check_devices, check_int_index, last_dim_contiguous
from ninfer.kernels.triton.paged_attention_kernels import combine_splits_kernel, paged_attn_kernel


def paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float | None = None,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    block_m: int = 16,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Causal GQA attention of T new tokens over each sequence's pages (history + the new tokens).

    q: [B, T, nh, hd]; k_pool, v_pool: [num_pages, page, nkv, hd] with the new tokens already
    written, either in a float dtype or int8 with k_scale, v_scale: [num_pages, page, nkv]
    (per-token per-head dequantisation scales, see `quantize_kv_int8`); page_table: [B, max_pages]
    int; cache_lens: [B] int. Query i of sequence b sees keys 0 .. cache_lens[b] + i.
    Softmax in fp32 (online); scale defaults to hd^-0.5; num_splits > 1 splits each sequence's
    pages over that many programs (flash-decoding) and combines them in a second launch; None picks
    enough splits for about four programs per SM on CUDA (at most 64 and max_pages), 1 on CPU;
    num_warps None: 8 for head_dim > 128 or fp32, else 4. The
    choice depends only on shapes, so a CUDA graph captured per (B, T, max_pages) stays valid.
    returns o: [B, T, nh, hd] in q's dtype (written into `out` when given).
    """
    return _launch(
        q,
        k_pool,
        v_pool,
        page_table,
        cache_lens,
        1,
        scale,
        k_scale,
        v_scale,
        num_splits,
        out,
        block_m,
        num_warps,
    )


def paged_attention_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    block_m: int = 16,
    num_warps: int | None = None,
) -> torch.Tensor:
    """One query token per sequence: q [N, nh, hd] over its first seq_lens[n] cached keys (this
    token's key included); seq_lens 0 marks a padding row (output zeros). Pools and options as in
    `paged_attention`. returns o: [N, nh, hd] in q's dtype."""
    if q.dim() != 3:
        raise ValueError(f"q must be [N, nh, hd]; got {tuple(q.shape)}")
    out4 = None if out is None else out.unsqueeze(1)
    o = _launch(
        q.unsqueeze(1),
        k_pool,
        v_pool,
        page_table,
        seq_lens,
        0,
        scale,
        k_scale,
        v_scale,
        num_splits,
        out4,
        block_m,
        num_warps,
    )
    return o[:, 0]


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _auto_splits(device: torch.device, programs: int, max_pages: int) -> int:
    if device.type != "cuda":
        return 1
    return max(1, min(64, max_pages, triton.cdiv(4 * _sm_count(device), programs)))


def _launch(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    lens: torch.Tensor,
    len_offset: int,
    scale: float | None,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    num_splits: int | None,
    out: torch.Tensor | None,
    block_m: int,
    num_warps: int | None,
) -> torch.Tensor:
    if q.dim() != 4 or k_pool.dim() != 4 or v_pool.shape != k_pool.shape:
        raise ValueError(
            f"q must be [B, T, nh, hd], pools [num_pages, page, nkv, hd]; got {q.shape}, {k_pool.shape}, {v_pool.shape}"
        )
    bsz, t, nh, hd = q.shape
    _, page, nkv, pool_hd = k_pool.shape
    if page < 16 or page & (page - 1):
        raise ValueError(f"page size must be a power of two >= 16; got {page}")
    if pool_hd != hd or nh % nkv:
        raise ValueError(f"q heads {nh} x {hd} do not fit pool heads {nkv} x {pool_hd}")
    if page_table.dim() != 2 or page_table.shape[0] != bsz or lens.shape != (bsz,):
        raise ValueError(
            f"page_table must be [B={bsz}, max_pages] and lens [B]; got {tuple(page_table.shape)}, {tuple(lens.shape)}"
        )
    check_int_index("page_table", page_table)
    check_int_index("cache_lens / seq_lens", lens)
    quant = k_pool.dtype == torch.int8
    if quant != (v_pool.dtype == torch.int8):
        raise TypeError(f"k and v pools must both be int8 or both float; got {k_pool.dtype}, {v_pool.dtype}")
    if quant:
        if k_scale is None or v_scale is None:
            raise ValueError("int8 KV pools need k_scale and v_scale [num_pages, page, nkv]")
        if k_scale.shape != k_pool.shape[:3] or v_scale.shape != k_pool.shape[:3]:
            raise ValueError(
                f"scales must be {tuple(k_pool.shape[:3])}; got {tuple(k_scale.shape)}, {tuple(v_scale.shape)}"
            )
    elif k_scale is not None or v_scale is not None:
        raise ValueError("k_scale / v_scale are only for int8 KV pools")
    group = nh // nkv
    bm = max(16, min(triton.next_power_of_2(block_m), triton.next_power_of_2(t * group)))
    m_blocks = triton.cdiv(t * group, bm)
    if num_splits is None:
        num_splits = _auto_splits(q.device, bsz * nkv * m_blocks, page_table.shape[1])
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1; got {num_splits}")
    ks = k_pool[..., 0] if k_scale is None else k_scale  # placeholder pointer when not quantised
    vs = v_pool[..., 0] if v_scale is None else v_scale
    check_devices(q, k_pool, v_pool, page_table, lens, ks, vs)
    last_dim_contiguous(q=q, k_pool=k_pool, v_pool=v_pool)
    if out is None:
        out = torch.empty(bsz, t, nh, hd, dtype=q.dtype, device=q.device)
    elif out.shape != (bsz, t, nh, hd) or out.stride(3) != 1:
        raise ValueError(f"out must be {(bsz, t, nh, hd)} with a contiguous last dim")
    if bsz == 0 or t == 0:
        return out

    if num_warps is None:  # 4 warps spill registers at head_dim 256 or fp32 tiles on sm_90 (ptxas -v)
        num_warps = 8 if hd > 128 or q.dtype == torch.float32 else 4
    grid = (bsz, nkv * m_blocks, num_splits)
    if num_splits == 1:
        dst, ml = out, out
    else:
        dst = torch.empty(num_splits, bsz, t, nh, hd, dtype=torch.float32, device=q.device)
        ml = torch.empty(num_splits, bsz, t, nh, 2, dtype=torch.float32, device=q.device)
    paged_attn_kernel[grid](
        q, k_pool, v_pool, ks, vs, page_table, lens, dst, ml,
        t, nh, hd**-0.5 if scale is None else scale,
        q.stride(0), q.stride(1), q.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        ks.stride(0), ks.stride(1), ks.stride(2),
        vs.stride(0), vs.stride(1), vs.stride(2),
        page_table.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        HD=hd, BD=triton.next_power_of_2(hd), PAGE=page, GROUP=group, BLOCK_M=bm, SPLITS=num_splits,
        LEN_OFFSET=len_offset, QUANT=quant, IEEE=q.dtype == torch.float32,
        num_warps=num_warps, **pdl.launch(q),
    )  # fmt: skip
    if num_splits > 1:
        rows = bsz * t * nh
        combine_splits_kernel[(rows,)](
            dst, ml, out, rows, t, nh,
            out.stride(0), out.stride(1), out.stride(2),
            HD=hd, BD=triton.next_power_of_2(hd), SPLITS=num_splits, SP=triton.next_power_of_2(num_splits),
            **pdl.launch(q),
        )  # fmt: skip
    return out
