"""Triton programs of the paged attention: per-(sequence, kv head, row block, split) pass and split combine."""

import triton
import triton.language as tl

from ninfer.kernels.triton.pdl import pdl_enter


@triton.jit
def paged_attn_kernel(
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
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
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
def combine_splits_kernel(
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
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
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
