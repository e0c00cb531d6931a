"""GQA attention of T new tokens over a paged KV pool (bf16/fp32 or int8 + per-token scales), split-K (Triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton._checks import check_devices, check_int_index, last_dim_contiguous


@triton.jit
def _paged_attn_kernel(
    q_ptr,  # [B, T, nh, hd]
    k_ptr,  # [num_pages, PAGE, nkv, hd]
    v_ptr,  # [num_pages, PAGE, nkv, hd]
    ks_ptr,  # [num_pages, PAGE, nkv] key scales (QUANT)
    vs_ptr,  # [num_pages, PAGE, nkv] value scales (QUANT)
    pt_ptr,  # [B, max_pages] int page ids
    lens_ptr,  # [B] int: keys before the first new token (LEN_OFFSET=1) or total keys (T=1, LEN_OFFSET=0)
    o_ptr,  # [B, T, nh, hd] (SPLITS == 1) or fp32 partial acc [SPLITS, B, T, nh, hd]
    ml_ptr,  # fp32 partial (max, sum) [SPLITS, B, T, nh, 2] (SPLITS > 1)
    T,
    NH,
    scale,
    s_qb, s_qt, s_qh,
    s_kp, s_kt, s_kh,
    s_vp, s_vt, s_vh,
    s_ksp, s_kst, s_ksh,
    s_vsp, s_vst, s_vsh,
    s_ptb,
    s_ob, s_ot, s_oh,
    HD: tl.constexpr,
    BD: tl.constexpr,
    PAGE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SPLITS: tl.constexpr,
    LEN_OFFSET: tl.constexpr,
    QUANT: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    m_blocks = tl.cdiv(T * GROUP, BLOCK_M)
    kvh = (tl.program_id(1) // m_blocks).to(tl.int64)
    mb = tl.program_id(1) % m_blocks
    split = tl.program_id(2)

    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # (token, head-in-group) pairs of this kv head
    row_ok = rows < T * GROUP
    tok = rows // GROUP
    head = kvh * GROUP + rows % GROUP
    offs_d = tl.arange(0, BD)
    mask_d = offs_d < HD
    base_len = tl.load(lens_ptr + b).to(tl.int64)
    row_len = base_len + tok + LEN_OFFSET  # keys visible to each row (causal)
    row_len = tl.where(row_ok, row_len, 0)
    kv_len = tl.max(row_len, axis=0)

    q = tl.load(
        q_ptr + b * s_qb + tok[:, None] * s_qt + head[:, None] * s_qh + offs_d[None, :],
        mask=row_ok[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_M, BD]
    n_pages = tl.cdiv(kv_len, PAGE)
    per_split = tl.cdiv(n_pages, SPLITS)
    p_begin = split * per_split
    p_end = tl.minimum(p_begin + per_split, n_pages)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BD], tl.float32)
    offs_t = tl.arange(0, PAGE)
    for p in range(p_begin, p_end):
        page = tl.maximum(tl.load(pt_ptr + b * s_ptb + p), 0).to(tl.int64)
        kv_mask = mask_d[None, :] & (p * PAGE + offs_t < kv_len)[:, None]
        k = tl.load(
            k_ptr + page * s_kp + offs_t[:, None] * s_kt + kvh * s_kh + offs_d[None, :], mask=kv_mask, other=0
        )  # [PAGE, BD]
        v = tl.load(
            v_ptr + page * s_vp + offs_t[:, None] * s_vt + kvh * s_vh + offs_d[None, :], mask=kv_mask, other=0
        )
        if IEEE:
            s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k.to(q.dtype)))  # [BLOCK_M, PAGE] fp32
        if QUANT:
            k_scale = tl.load(ks_ptr + page * s_ksp + offs_t * s_kst + kvh * s_ksh).to(tl.float32)
            s = s * k_scale[None, :]
        s = s * scale
        visible = (p * PAGE + offs_t)[None, :] < row_len[:, None]
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no visible key yet
        alpha = tl.exp(m_i - m_safe)
        prob = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(prob, axis=1)
        if QUANT:
            v_scale = tl.load(vs_ptr + page * s_vsp + offs_t * s_vst + kvh * s_vsh).to(tl.float32)
            prob = prob * v_scale[None, :]
        if IEEE:
            pv = tl.dot(prob.to(q.dtype), v.to(q.dtype), input_precision="ieee")
        else:
            pv = tl.dot(prob.to(q.dtype), v.to(q.dtype))
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    out_mask = row_ok[:, None] & mask_d[None, :]
    if SPLITS == 1:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        o_ptrs = o_ptr + b * s_ob + tok[:, None] * s_ot + head[:, None] * s_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=out_mask)
    else:
        flat = ((split * tl.num_programs(0) + b) * T + tok) * NH + head  # [BLOCK_M] row of the partials
        tl.store(o_ptr + flat[:, None] * HD + offs_d[None, :], acc, mask=out_mask)
        tl.store(ml_ptr + flat * 2, m_i, mask=row_ok)
        tl.store(ml_ptr + flat * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _combine_splits_kernel(
    acc_ptr,  # fp32 [SPLITS, R, hd], R = B*T*nh
    ml_ptr,  # fp32 [SPLITS, R, 2]
    o_ptr,  # [B, T, nh, hd]
    R,
    T,
    NH,
    s_ob, s_ot, s_oh,
    HD: tl.constexpr,
    BD: tl.constexpr,
    SPLITS: tl.constexpr,
    SP: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, SP)
    mask_s = offs_s < SPLITS
    offs_d = tl.arange(0, BD)
    mask_d = offs_d < HD
    m = tl.load(ml_ptr + (offs_s * R + r) * 2, mask=mask_s, other=float("-inf"))
    l_s = tl.load(ml_ptr + (offs_s * R + r) * 2 + 1, mask=mask_s, other=0.0)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp(m - m_max)  # [SP]
    total = tl.sum(w * l_s, axis=0)
    acc = tl.load(
        acc_ptr + (offs_s[:, None] * R + r) * HD + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    b = r // (T * NH)
    t = (r // NH) % T
    h = r % NH
    tl.store(o_ptr + b * s_ob + t * s_ot + h * s_oh + offs_d, out.to(o_ptr.dtype.element_ty), mask=mask_d)


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
    num_splits: int = 1,
    out: torch.Tensor | None = None,
    block_m: int = 16,
    num_warps: int = 4,
) -> torch.Tensor:
    """Causal GQA attention of T new tokens over each sequence's pages (history + the new tokens).

    q: [B, T, nh, hd]; k_pool, v_pool: [num_pages, page, nkv, hd] with the new tokens already
    written, either in a float dtype or int8 with k_scale, v_scale: [num_pages, page, nkv]
    (per-token per-head dequantisation scales, see `quantize_kv_int8`); page_table: [B, max_pages]
    int; cache_lens: [B] int. Query i of sequence b sees keys 0 .. cache_lens[b] + i.
    Softmax in fp32 (online); scale defaults to hd^-0.5; num_splits > 1 splits each sequence's
    pages over that many programs (flash-decoding) and combines them in a second launch.
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
    num_splits: int = 1,
    out: torch.Tensor | None = None,
    block_m: int = 16,
    num_warps: int = 4,
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
    num_splits: int,
    out: torch.Tensor | None,
    block_m: int,
    num_warps: int,
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

    group = nh // nkv
    bm = max(16, min(triton.next_power_of_2(block_m), triton.next_power_of_2(t * group)))
    grid = (bsz, nkv * triton.cdiv(t * group, bm), num_splits)
    if num_splits == 1:
        dst, ml = out, out
    else:
        dst = torch.empty(num_splits, bsz, t, nh, hd, dtype=torch.float32, device=q.device)
        ml = torch.empty(num_splits, bsz, t, nh, 2, dtype=torch.float32, device=q.device)
    _paged_attn_kernel[grid](
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
        num_warps=num_warps,
    )  # fmt: skip
    if num_splits > 1:
        rows = bsz * t * nh
        _combine_splits_kernel[(rows,)](
            dst, ml, out, rows, t, nh,
            out.stride(0), out.stride(1), out.stride(2),
            HD=hd, BD=triton.next_power_of_2(hd), SPLITS=num_splits, SP=triton.next_power_of_2(num_splits),
        )  # fmt: skip
    return out
