"""Torch reference of paged KV writes and attention over 64-token pages (prefill-with-history and decode)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.kernels.kv_quant import dequantize_kv_int8, quantize_kv_int8


def _token_slots(page_table: torch.Tensor, cache_lens: torch.Tensor, q_len: int, page: int) -> torch.Tensor:
    """Flat pool row (page * page_size + offset) of each new token. -> [B, q] int64"""
    pos = cache_lens[:, None] + torch.arange(q_len, device=cache_lens.device)  # [B, q]
    pages = torch.gather(page_table.long(), 1, torch.div(pos, page, rounding_mode="floor"))
    return pages * page + pos % page


def write_kv(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    page_table: torch.Tensor,
    cache_lens: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Store new keys/values at positions cache_lens .. cache_lens+q-1 of each sequence.

    k_pool, v_pool: [num_pages, page, nkv, hd]; k, v: [B, q, nkv, hd];
    page_table: [B, max_pages] int32; cache_lens: [B] int64.
    int8 pools quantise on write (`quantize_kv_int8`, per token and head) and store the scales in
    k_scale, v_scale: [num_pages, page, nkv].
    """
    page, nkv, hd = k_pool.shape[1:]
    rows = _token_slots(page_table, cache_lens, k.shape[1], page).reshape(-1)
    if k_pool.dtype == torch.int8:
        if k_scale is None or v_scale is None:
            raise ValueError("int8 KV pools need k_scale and v_scale [num_pages, page, nkv]")
        for pool, scales, x in ((k_pool, k_scale, k), (v_pool, v_scale, v)):
            xq, sc = quantize_kv_int8(x.reshape(-1, nkv, hd), scales.dtype)
            pool.view(-1, nkv, hd).index_copy_(0, rows, xq)
            scales.view(-1, nkv).index_copy_(0, rows, sc)
        return
    k_pool.view(-1, nkv, hd).index_copy_(0, rows, k.reshape(-1, nkv, hd).to(k_pool.dtype))
    v_pool.view(-1, nkv, hd).index_copy_(0, rows, v.reshape(-1, nkv, hd).to(v_pool.dtype))


def paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float,
    max_kv_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal GQA attention of q new tokens over each sequence's pages (history + the new tokens).

    q: [B, q, nh, hd]; k_pool, v_pool: [num_pages, page, nkv, hd] (new tokens already written);
    page_table: [B, max_pages] int32 (entries past the sequence's pages may be any valid page id
    or -1); cache_lens: [B] int64. Query i of sequence b sees keys 0 .. cache_lens[b] + i.
    max_kv_len: a host-side upper bound on cache_lens + q (known to the scheduler, so no device
    sync); keys beyond it are not gathered. None = the whole page table width (static shapes).
    int8 pools are dequantised with k_scale, v_scale: [num_pages, page, nkv] to q's dtype.
    returns o: [B, q, nh, hd] in q's dtype.
    """
    b, q_len, nh, hd = q.shape
    page, nkv = k_pool.shape[1], k_pool.shape[2]
    pt = page_table.long().clamp(min=0)
    n_keys = pt.shape[1] * page if max_kv_len is None else min(max_kv_len, pt.shape[1] * page)
    pt = pt[:, : -(-n_keys // page)]
    keys, vals = k_pool[pt], v_pool[pt]  # [B, pages, page, nkv, hd]
    if k_pool.dtype == torch.int8:
        if k_scale is None or v_scale is None:
            raise ValueError("int8 KV pools need k_scale and v_scale [num_pages, page, nkv]")
        keys = dequantize_kv_int8(keys, k_scale[pt], q.dtype)
        vals = dequantize_kv_int8(vals, v_scale[pt], q.dtype)
    keys = keys.reshape(b, -1, nkv, hd)[:, :n_keys].transpose(1, 2)  # [B, nkv, L, hd]
    vals = vals.reshape(b, -1, nkv, hd)[:, :n_keys].transpose(1, 2)
    q_pos = cache_lens[:, None] + torch.arange(q_len, device=q.device)  # [B, q]
    key_pos = torch.arange(n_keys, device=q.device)
    mask = key_pos[None, None, :] <= q_pos[:, :, None]  # [B, q, L]
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), keys, vals, attn_mask=mask[:, None], scale=scale, enable_gqa=nh != nkv
    )  # [B, nh, q, hd]
    return o.transpose(1, 2).to(q.dtype)
