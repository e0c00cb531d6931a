"""Prefill-with-history attention: one sequence's pages gathered once, then torch SDPA (flash on CUDA).

A prefill chunk of T >= 64 tokens is arithmetic-heavy: the paged Triton kernel, tiled for decode
(a few query rows per program), re-reads the whole history for every 16 query rows. Here the
sequence's keys and values are gathered into one contiguous [L, nkv, hd] copy (int8 pools are
dequantised on the way), the kv heads repeated to the query heads, and attention runs through
`scaled_dot_product_attention` with a lower-right causal mask (query i sees keys 0 .. L - T + i),
which dispatches to the flash kernel for bf16/fp16 on CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from ninfer.kernels.kv_quant import dequantize_kv_int8

MIN_TOKENS = 64  # chunks at least this long take this path (single-sequence batches only)


def applies(q: torch.Tensor, max_kv_len: int | None) -> bool:
    """Whether `prefill_attention` serves this call: one sequence, T >= MIN_TOKENS, and the
    host-side bound max_kv_len (= cache_len + T for a single sequence) known."""
    return max_kv_len is not None and q.shape[0] == 1 and q.shape[1] >= MIN_TOKENS


def prefill_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    kv_len: int,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [1, T, nh, hd] (new tokens at positions kv_len - T .. kv_len - 1, already written to the
    pools); pools [num_pages, page, nkv, hd] (+ int8 scales [num_pages, page, nkv]); page_table
    [1, max_pages]. returns o: [1, T, nh, hd] in q's dtype."""
    _, t, nh, hd = q.shape
    page, nkv = k_pool.shape[1], k_pool.shape[2]
    if kv_len < t:
        raise ValueError(f"kv_len {kv_len} is shorter than the {t} new tokens")
    pages = page_table[0, : -(-kv_len // page)].long()  # [P] the sequence's first pages, all valid
    keys, vals = k_pool[pages], v_pool[pages]  # [P, page, nkv, hd]
    if k_pool.dtype == torch.int8:
        if k_scale is None or v_scale is None:
            raise ValueError("int8 KV pools need k_scale and v_scale [num_pages, page, nkv]")
        keys = dequantize_kv_int8(keys, k_scale[pages], q.dtype)
        vals = dequantize_kv_int8(vals, v_scale[pages], q.dtype)
    keys = keys.reshape(-1, nkv, hd)[:kv_len].to(q.dtype).transpose(0, 1)  # [nkv, L, hd]
    vals = vals.reshape(-1, nkv, hd)[:kv_len].to(q.dtype).transpose(0, 1)
    if nh != nkv:  # explicit repeat: every SDPA backend takes equal head counts
        keys = keys.repeat_interleave(nh // nkv, dim=0)
        vals = vals.repeat_interleave(nh // nkv, dim=0)
    o = F.scaled_dot_product_attention(
        q[0].transpose(0, 1)[None],  # [1, nh, T, hd]
        keys[None],
        vals[None],
        attn_mask=causal_lower_right(t, kv_len),
        scale=scale,
    )  # [1, nh, T, hd]
    return o.transpose(1, 2)
