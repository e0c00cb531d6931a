"""Triton helpers that decode one scale group of a quantized weight's rows in registers (shared by
the quantized GEMV and the quantized MoE expert kernels).

Formats (`FMT`): 0 Q4, 1 Q5, 2 Q6 (groups of 64, lanes split by parity: byte j of a group's base
plane holds lanes 2j and 2j + 1), 3 W8 (groups of 32), 4 fp8 (128-lane blocks, one fp32 scale per
128 x 128 block). `decode_group` returns the group's lanes as exact values of `cdt` (for Q4 / Q5 /
Q6 the even and the odd lanes, for W8 / fp8 all lanes twice) and the rows' scales; with `BF16_MAGIC`
the Q4 / Q5 / Q6 values are bf16 128 + SIGN + q (bit operations only, no conversion instruction) and
the caller subtracts (128 + SIGN) * sum(x) after its dot.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _values(u, SIGN: tl.constexpr, MAGIC: tl.constexpr, BF16_MAGIC: tl.constexpr, cdt: tl.constexpr):
    """Unsigned b-bit words -> signed values as `cdt` (BF16_MAGIC: bf16 128 + SIGN + q)."""
    off = u ^ SIGN  # q + SIGN, in [0, 2 SIGN)
    if BF16_MAGIC:
        v = (off | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
    elif MAGIC:  # 2^23 + off read as fp32, minus 2^23 + SIGN: q, exactly
        v = ((off | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + SIGN)).to(cdt)
    else:
        v = (off - SIGN).to(cdt)
    return v


@triton.jit
def decode_group(
    base_ptr, high_ptr, scale_ptr,
    prow, srow,  # [BN] int64: each row's plane row and scale row (fp8: its 128-row block)
    g, K,  # the group index along K; K (fp8 masks the lanes of a partial last block)
    sb, sh, ss,  # row strides of the base, high and scale planes
    FMT: tl.constexpr,
    MAGIC: tl.constexpr,
    BF16_MAGIC: tl.constexpr,
    cdt: tl.constexpr,
):  # fmt: skip
    """-> (w_even [BN, G/2], w_odd [BN, G/2], s [BN] fp32) for Q4 / Q5 / Q6; (w [BN, G], w, s) else."""
    G: tl.constexpr = 64 if FMT < 3 else (32 if FMT == 3 else 128)
    SIGN: tl.constexpr = 8 if FMT == 0 else (16 if FMT == 1 else (32 if FMT == 2 else 128))
    if FMT < 3:
        jj = tl.arange(0, G // 2)
        b = tl.load(base_ptr + prow[:, None] * sb + g * (G // 2) + jj[None, :]).to(tl.int32)  # [BN, G/2]
        ue = b & 15
        uo = (b >> 4) & 15
        if FMT == 1:  # Q5: bit 4 of lane i is bit i % 8 of the group's high byte i // 8
            hb = tl.load(high_ptr + prow[:, None] * sh + g * 8 + (jj // 4)[None, :]).to(tl.int32)
            se = (2 * (jj % 4))[None, :]
            ue = ue | (((hb >> se) & 1) << 4)
            uo = uo | (((hb >> (se + 1)) & 1) << 4)
        if FMT == 2:  # Q6: bits 4, 5 of lane i are bits 2 (i % 4), +1 of high byte i // 4
            hb = tl.load(high_ptr + prow[:, None] * sh + g * 16 + (jj // 2)[None, :]).to(tl.int32)
            se = (4 * (jj % 2))[None, :]
            ue = ue | (((hb >> se) & 3) << 4)
            uo = uo | (((hb >> (se + 2)) & 3) << 4)
        s = tl.load(scale_ptr + srow * ss + g).to(tl.float32)
        we = _values(ue, SIGN, MAGIC, BF16_MAGIC, cdt)
        wo = _values(uo, SIGN, MAGIC, BF16_MAGIC, cdt)
    else:
        kk = g * G + tl.arange(0, G)
        if FMT == 3:
            q = tl.load(base_ptr + prow[:, None] * sb + kk[None, :]).to(tl.int8, bitcast=True)
            we = q.to(cdt)
            s = tl.load(scale_ptr + srow * ss + g).to(tl.float32)
        else:
            q = tl.load(base_ptr + prow[:, None] * sb + kk[None, :], mask=kk[None, :] < K, other=0.0)
            we = q.to(cdt)
            s = tl.load(scale_ptr + srow * ss + g)
        wo = we
    return we, wo, s
