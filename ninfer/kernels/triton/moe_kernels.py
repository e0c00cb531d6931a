"""Triton kernels of `moe.moe_experts_small`: expert-deduplicated gate/up GEMM and per-token down GEMV.

Both stream weight tiles through `tl.dot` (tensor cores for bf16, ieee fp32 for fp32 inputs) so the
compiler pipelines the loads (`num_stages`) and keeps enough bytes in flight to run at the memory
bandwidth; arithmetic is negligible next to the weight reads. Accumulation is fp32 throughout.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gate_up_kernel(
    x_ptr, w_ptr, idx_ptr, act_ptr,  # x [N, H]; w [E, 2*Ie, H]; idx [N*K]; act [N*K, Ie]
    N, H, IE,
    s_x, s_we, s_wr, s_a,
    K: tl.constexpr,
    KP: tl.constexpr,  # K rounded up to a power of two
    NP: tl.constexpr,  # N rounded up to a power of two, >= 16 (the dot's minimum width)
    BN: tl.constexpr,  # intermediate columns per program (BN gate rows + BN up rows)
    BK: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """Program (m, tile): the expert of (token, expert) row m, if m is that expert's first row.

    Every token routed to the expert is computed from the one read of its weights; later rows of
    the same expert run no loop and store nothing. act[t*K + j] = silu(gate_e x_t) * up_e x_t.
    """
    m = tl.program_id(0)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)  # [BN]
    mask_c = cols < IE
    tn = tl.arange(0, NP)  # [NP] tokens
    kk = tl.arange(0, KP)
    slot = tn[:, None] * K + kk[None, :]  # [NP, KP]
    live = (tn[:, None] < N) & (kk[None, :] < K)
    ids = tl.load(idx_ptr + slot, mask=live, other=-1)  # [NP, KP]
    e = tl.load(idx_ptr + m)
    hit = ids == e
    first = tl.min(tl.min(tl.where(hit, slot, NP * KP), axis=1), axis=0)
    owner = first == m  # the only program of this expert (and column tile) that works
    jpos = tl.min(tl.where(hit, kk[None, :], KP), axis=1)  # [NP] position of e in each token's top-k
    uses = (jpos < K) & owner  # [NP]
    h_end = tl.where(owner, H, 0)  # duplicate rows run no iteration (no host-side branching)
    w_g = w_ptr + e.to(tl.int64) * s_we + cols[:, None].to(tl.int64) * s_wr  # [BN, 1]
    w_u = w_g + IE * s_wr
    x_t = x_ptr + tn[None, :] * s_x  # [1, NP]
    acc_g = tl.zeros([BN, NP], dtype=tl.float32)
    acc_u = tl.zeros([BN, NP], dtype=tl.float32)
    for k0 in range(0, h_end, BK):
        offs_k = k0 + tl.arange(0, BK)  # [BK]
        mask_k = offs_k < H
        xt = tl.load(x_t + offs_k[:, None], mask=mask_k[:, None] & (tn[None, :] < N), other=0.0)  # [BK, NP]
        mw = mask_c[:, None] & mask_k[None, :]
        wg = tl.load(w_g + offs_k[None, :], mask=mw, other=0.0)  # [BN, BK]
        wu = tl.load(w_u + offs_k[None, :], mask=mw, other=0.0)
        acc_g = tl.dot(wg, xt, acc_g, input_precision=PREC)  # [BN, NP]
        acc_u = tl.dot(wu, xt, acc_u, input_precision=PREC)
    dt = act_ptr.dtype.element_ty
    g = acc_g.to(dt).to(tl.float32)  # roundings as in moe_ref: projection, silu, product
    u = acc_u.to(dt).to(tl.float32)
    act = (g * tl.sigmoid(g)).to(dt).to(tl.float32) * u
    rows = tn * K + jpos  # [NP] act row of (token, e)
    ptrs = act_ptr + rows[None, :].to(tl.int64) * s_a + cols[:, None]
    tl.store(ptrs, act.to(dt), mask=mask_c[:, None] & uses[None, :])


@triton.jit
def down_kernel(
    act_ptr, w_ptr, idx_ptr, tw_ptr, y_ptr,  # act [N*K, Ie]; w [E, H, Ie]; idx, tw [N*K]; y [N, H]
    H, IE,
    s_a, s_we, s_wr, s_y,
    K: tl.constexpr,
    BN: tl.constexpr,  # output rows per program
    BK: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """Program (token n, row tile): y[n] = sum_j w_j * down_{e_j} act_{n,j}, experts in slot order.

    One flat loop over the K experts' Ie chunks (one pipeline, no per-expert prologue). Tokens are
    the fastest grid axis, so the programs of one row tile run together and an expert that several
    tokens share is read from HBM once and served from L2 to the others.
    """
    n = tl.program_id(0)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)  # [BN]
    mask_r = rows < H
    lane = tl.arange(0, 16)  # the dot's minimum width: column 0 carries the activation
    dt = y_ptr.dtype.element_ty
    chunks = tl.cdiv(IE, BK)
    out = tl.zeros([BN], dtype=tl.float32)
    acc = tl.zeros([BN, 16], dtype=tl.float32)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * s_wr  # [BN, 1]
    for it in range(0, K * chunks):
        j = it // chunks
        c = it - j * chunks
        m = n * K + j
        e = tl.load(idx_ptr + m).to(tl.int64)
        offs_k = c * BK + tl.arange(0, BK)  # [BK]
        mask_k = offs_k < IE
        wv = tl.load(w_rows + e * s_we + offs_k[None, :], mask=mask_r[:, None] & mask_k[None, :], other=0.0)
        a = tl.load(act_ptr + m * s_a + offs_k, mask=mask_k, other=0.0)  # [BK]
        b = tl.where(lane[None, :] == 0, a[:, None], tl.zeros_like(a)[:, None])  # [BK, 16]
        acc = tl.dot(wv, b, acc, input_precision=PREC)  # [BN, 16], columns 1.. stay 0
        last = c == chunks - 1
        wt = tl.load(tw_ptr + m).to(tl.float32)
        y_e = tl.sum(acc, axis=1).to(dt).to(tl.float32)  # the expert's output, rounded as in moe_ref
        out += tl.where(last, (y_e * wt).to(dt).to(tl.float32), 0.0)
        acc = tl.where(last, 0.0, acc)
    tl.store(y_ptr + n * s_y + rows, out.to(dt), mask=mask_r)
