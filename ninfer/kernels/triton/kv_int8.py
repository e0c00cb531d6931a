"""Symmetric per-token per-head int8 KV quantisation and the paged write of quantised K/V (torch ops)."""

from __future__ import annotations

import torch

from ninfer.kernels.kv_quant import quantize_kv_int8

__all__ = ["quantize_kv_int8", "write_kv_int8"]


def write_kv_int8(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    page_table: torch.Tensor,
    cache_lens: torch.Tensor,
) -> None:
    """Quantise and store new keys/values at positions cache_lens .. cache_lens+T-1 of each sequence.

    k_pool, v_pool: [num_pages, page, nkv, hd] int8; k_scale, v_scale: [num_pages, page, nkv];
    k, v: [B, T, nkv, hd]; page_table: [B, max_pages] int; cache_lens: [B] int.
    """
    if k_pool.dtype != torch.int8 or v_pool.dtype != torch.int8:
        raise TypeError(f"int8 pools expected; got {k_pool.dtype}, {v_pool.dtype}")
    page, nkv, hd = k_pool.shape[1:]
    bsz, t = k.shape[:2]
    pos = cache_lens.long()[:, None] + torch.arange(t, device=k.device)  # [B, T]
    pages = torch.gather(page_table.long(), 1, torch.div(pos, page, rounding_mode="floor"))
    rows = (pages * page + pos % page).reshape(-1)  # flat pool row of each new token
    for pool, scales, x in ((k_pool, k_scale, k), (v_pool, v_scale, v)):
        xq, s = quantize_kv_int8(x.reshape(bsz * t, nkv, hd), scales.dtype)
        pool.view(-1, nkv, hd).index_copy_(0, rows, xq)
        scales.view(-1, nkv).index_copy_(0, rows, s)
