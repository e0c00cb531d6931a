"""Triton kernels of `moe.moe_experts_small`: expert-deduplicated gate/up and down GEMMs, then a slot-order sum.

The two GEMM kernels run one program per (token, expert) row and weight tile; only the first row of
each distinct expert works, reading the expert's tile once for every token routed to it, so the
grid scales with the distinct experts rather than the tokens. They stream weight tiles through
`tl.dot` (tensor cores for bf16, ieee fp32 for fp32 inputs) so the compiler pipelines the loads
(`num_stages`) and keeps enough bytes in flight to run at the memory bandwidth; arithmetic is
negligible next to the weight reads. Accumulation is fp32 throughout. The down kernel writes each
(token, expert) row's weighted output; `expert_sum_kernel` adds a token's k rows in fp32 in slot
order (deterministic: no atomics).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer.kernels.triton.pdl import pdl_enter


@triton.jit
def _expert_of_row(idx_ptr, m, N, K: tl.constexpr, KP: tl.constexpr, NP: tl.constexpr):
    """(token, expert) row m of idx [N*K] -> (its expert e; whether m is e's first row, the one
    program of each weight tile that works; [NP] the slot of e in each token's top-k, K if none)."""
    tn = tl.arange(0, NP)  # [NP] tokens
    kk = tl.arange(0, KP)
    slot = tn[:, None] * K + kk[None, :]  # [NP, KP]
    live = (tn[:, None] < N) & (kk[None, :] < K)
    ids = tl.load(idx_ptr + slot, mask=live, other=-1)  # [NP, KP]
    e = tl.load(idx_ptr + m)
    hit = ids == e
    first = tl.min(tl.min(tl.where(hit, slot, NP * KP), axis=1), axis=0)
    jpos = tl.min(tl.where(hit, kk[None, :], KP), axis=1)  # [NP]
    return e, first == m, jpos


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
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
    """Program (m, tile): the expert of (token, expert) row m, if m is that expert's first row.

    Every token routed to the expert is computed from the one read of its weights; later rows of
    the same expert run no loop and store nothing. act[t*K + j] = silu(gate_e x_t) * up_e x_t.
    """
    m = tl.program_id(0)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)  # [BN]
    mask_c = cols < IE
    tn = tl.arange(0, NP)  # [NP] tokens
    e, owner, jpos = _expert_of_row(idx_ptr, m, N, K, KP, NP)
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
    act_ptr, w_ptr, idx_ptr, tw_ptr, z_ptr,  # act [N*K, Ie]; w [E, H, Ie]; idx, tw [N*K]; z [N*K, H]
    N, H, IE,
    s_a, s_we, s_wr, s_z,
    K: tl.constexpr,
    KP: tl.constexpr,  # K rounded up to a power of two
    NP: tl.constexpr,  # N rounded up to a power of two, >= 16 (the dot's minimum width)
    BN: tl.constexpr,  # output rows per program
    BK: tl.constexpr,
    PREC: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
    """Program (m, tile): the expert of (token, expert) row m, if m is that expert's first row.

    Every token routed to the expert is computed from the one read of its down rows; later rows
    of the same expert run no loop and store nothing. z[t*K + j] = (down_e act_{t,j}) * w_{t,j},
    the projection and the weighted output rounded to the activation dtype as in moe_ref.
    """
    m = tl.program_id(0)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)  # [BN]
    mask_r = rows < H
    tn = tl.arange(0, NP)  # [NP] tokens
    e, owner, jpos = _expert_of_row(idx_ptr, m, N, K, KP, NP)
    routed = jpos < K  # [NP]
    uses = routed & owner
    ie_end = tl.where(owner, IE, 0)  # duplicate rows run no iteration (no host-side branching)
    slots = tn * K + jpos  # [NP] act / z row of (token, e)
    w_r = w_ptr + e.to(tl.int64) * s_we + rows[:, None].to(tl.int64) * s_wr  # [BN, 1]
    a_t = act_ptr + slots[None, :].to(tl.int64) * s_a  # [1, NP]
    acc = tl.zeros([BN, NP], dtype=tl.float32)
    for k0 in range(0, ie_end, BK):
        offs_k = k0 + tl.arange(0, BK)  # [BK]
        mask_k = offs_k < IE
        at = tl.load(a_t + offs_k[:, None], mask=mask_k[:, None] & routed[None, :], other=0.0)  # [BK, NP]
        wv = tl.load(w_r + offs_k[None, :], mask=mask_r[:, None] & mask_k[None, :], other=0.0)  # [BN, BK]
        acc = tl.dot(wv, at, acc, input_precision=PREC)  # [BN, NP]
    dt = z_ptr.dtype.element_ty
    wt = tl.load(tw_ptr + slots, mask=uses, other=0.0).to(tl.float32)  # [NP]
    y_e = acc.to(dt).to(tl.float32)  # the expert's output, rounded as in moe_ref
    ptrs = z_ptr + slots[None, :].to(tl.int64) * s_z + rows[:, None]
    tl.store(ptrs, (y_e * wt[None, :]).to(dt), mask=mask_r[:, None] & uses[None, :])


@triton.jit
def expert_sum_kernel(
    z_ptr, y_ptr,  # z [N*K, H]; y [N, H]
    H, s_z, s_y,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
    """Program (token n, column block): y[n] = sum_j z[n*K + j] in fp32, in slot order j = 0..K-1."""
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < H
    out = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(K):
        out += tl.load(z_ptr + (n * K + j) * s_z + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + n * s_y + cols, out.to(y_ptr.dtype.element_ty), mask=mask)
