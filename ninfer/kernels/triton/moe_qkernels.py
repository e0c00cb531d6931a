"""Triton kernels of `moe.moe_experts_small` over quantized expert banks (`QuantWeight` [E, N, K]):
the expert-deduplicated gate/up and down GEMMs of `moe_kernels`, each weight tile decoded one scale
group at a time from its codes and scales (`qdecode.decode_group`). The slot-order sum is shared.

Plane rows of a bank are expert-major (expert e's row r is plane row e * N + r); an fp8 bank's
scale blocks are each expert's own (block row e * ceil(N / 128) + r // 128). Roundings follow
`moe_kernels` (projections, silu, product and weighted output in the activation dtype)."""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer.kernels.triton.moe_kernels import _expert_of_row
from ninfer.kernels.triton.pdl import pdl_enter
from ninfer.kernels.triton.qdecode import decode_group


@triton.jit
def _group_product(
    base_ptr, high_ptr, scale_ptr, prow, srow, g, KD, sb, sh, ss, x_t, s_xk, xmask_t,
    FMT: tl.constexpr, MAGIC: tl.constexpr, BF16_MAGIC: tl.constexpr, cdt: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """One scale group's contribution to acc [BN, NP]: (W_g x_g) * s, W_g decoded in registers.
    x_t [1, NP] pointers of the tokens' rows (lanes at stride s_xk), xmask_t [1, NP] live tokens."""
    G: tl.constexpr = 64 if FMT < 3 else (32 if FMT == 3 else 128)
    w, s = decode_group(base_ptr, high_ptr, scale_ptr, prow, srow, g, KD, sb, sh, ss, FMT, MAGIC, BF16_MAGIC, cdt)
    kk = g * G + tl.arange(0, G)
    xt = tl.load(x_t + kk[:, None] * s_xk, mask=(kk[:, None] < KD) & xmask_t, other=0.0)  # [G, NP]
    p = tl.dot(w, xt.to(cdt), input_precision=PREC)
    if BF16_MAGIC:  # the values were 128 + SIGN + q
        SIGN: tl.constexpr = 8 if FMT == 0 else (16 if FMT == 1 else 32)
        p = p - (128.0 + SIGN) * tl.sum(xt.to(tl.float32), axis=0)[None, :]
    return p * s[:, None]


@triton.jit
def gate_up_q_kernel(
    x_ptr, base_ptr, high_ptr, scale_ptr, idx_ptr, act_ptr,  # x [N, H]; bank [E, 2*Ie, H] planes; idx [N*K]; act [N*K, Ie]
    N, H, IE, GROUPS,
    s_x, sb, sh, ss, s_a,
    K: tl.constexpr,
    KP: tl.constexpr,
    NP: tl.constexpr,
    BN: tl.constexpr,
    FMT: tl.constexpr,
    MAGIC: tl.constexpr,
    XDT: tl.constexpr,  # 0 fp32, 1 bf16, 2 fp16
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    PREC: tl.constexpr = "ieee" if XDT == 0 else "tf32"
    cdt: tl.constexpr = tl.float32 if XDT == 0 else (tl.bfloat16 if XDT == 1 else tl.float16)
    BF16_MAGIC: tl.constexpr = MAGIC and XDT == 1 and FMT < 3
    m = tl.program_id(0)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    mask_c = cols < IE
    colc = tl.minimum(cols, IE - 1).to(tl.int64)  # clamped: loads stay unmasked along rows
    tn = tl.arange(0, NP)
    e, owner, jpos = _expert_of_row(idx_ptr, m, N, K, KP, NP)
    uses = (jpos < K) & owner
    g_end = tl.where(owner, GROUPS, 0)  # duplicate rows run no iteration
    e64 = e.to(tl.int64)
    prow_g = e64 * 2 * IE + colc
    prow_u = prow_g + IE
    if FMT == 4:
        nb = (2 * IE + 127) // 128
        srow_g = e64 * nb + colc // 128
        srow_u = e64 * nb + (colc + IE) // 128
    else:
        srow_g = prow_g
        srow_u = prow_u
    x_t = x_ptr + tn[None, :].to(tl.int64) * s_x  # [1, NP]
    live = tn[None, :] < N
    acc_g = tl.zeros([BN, NP], dtype=tl.float32)
    acc_u = tl.zeros([BN, NP], dtype=tl.float32)
    for g in range(0, g_end):
        acc_g += _group_product(base_ptr, high_ptr, scale_ptr, prow_g, srow_g, g, H, sb, sh, ss, x_t, 1, live,
                                FMT, MAGIC, BF16_MAGIC, cdt, PREC)  # fmt: skip
        acc_u += _group_product(base_ptr, high_ptr, scale_ptr, prow_u, srow_u, g, H, sb, sh, ss, x_t, 1, live,
                                FMT, MAGIC, BF16_MAGIC, cdt, PREC)  # fmt: skip
    dt = act_ptr.dtype.element_ty
    gv = acc_g.to(dt).to(tl.float32)
    u = acc_u.to(dt).to(tl.float32)
    act = (gv * tl.sigmoid(gv)).to(dt).to(tl.float32) * u
    rows = tn * K + jpos
    ptrs = act_ptr + rows[None, :].to(tl.int64) * s_a + cols[:, None]
    tl.store(ptrs, act.to(dt), mask=mask_c[:, None] & uses[None, :])


@triton.jit
def down_q_kernel(
    act_ptr, base_ptr, high_ptr, scale_ptr, idx_ptr, tw_ptr, z_ptr,  # act [N*K, Ie]; bank [E, H, Ie]; z [N*K, H]
    N, H, IE, GROUPS,
    s_a, sb, sh, ss, s_z,
    K: tl.constexpr,
    KP: tl.constexpr,
    NP: tl.constexpr,
    BN: tl.constexpr,
    FMT: tl.constexpr,
    MAGIC: tl.constexpr,
    XDT: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    PREC: tl.constexpr = "ieee" if XDT == 0 else "tf32"
    cdt: tl.constexpr = tl.float32 if XDT == 0 else (tl.bfloat16 if XDT == 1 else tl.float16)
    BF16_MAGIC: tl.constexpr = MAGIC and XDT == 1 and FMT < 3
    m = tl.program_id(0)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    mask_r = rows < H
    rowc = tl.minimum(rows, H - 1).to(tl.int64)
    tn = tl.arange(0, NP)
    e, owner, jpos = _expert_of_row(idx_ptr, m, N, K, KP, NP)
    routed = jpos < K
    uses = routed & owner
    g_end = tl.where(owner, GROUPS, 0)
    e64 = e.to(tl.int64)
    prow = e64 * H + rowc
    if FMT == 4:
        srow = e64 * ((H + 127) // 128) + rowc // 128
    else:
        srow = prow
    slots = tn * K + jpos
    a_t = act_ptr + slots[None, :].to(tl.int64) * s_a  # [1, NP]
    acc = tl.zeros([BN, NP], dtype=tl.float32)
    for g in range(0, g_end):
        acc += _group_product(base_ptr, high_ptr, scale_ptr, prow, srow, g, IE, sb, sh, ss, a_t, 1, routed[None, :],
                              FMT, MAGIC, BF16_MAGIC, cdt, PREC)  # fmt: skip
    dt = z_ptr.dtype.element_ty
    wt = tl.load(tw_ptr + slots, mask=uses, other=0.0).to(tl.float32)
    y_e = acc.to(dt).to(tl.float32)
    ptrs = z_ptr + slots[None, :].to(tl.int64) * s_z + rows[:, None]
    tl.store(ptrs, (y_e * wt[None, :]).to(dt), mask=mask_r[:, None] & uses[None, :])
