"""Triton helpers that decode one scale group of a quantized weight's rows in registers (shared by
the quantized GEMV, the quantized MoE expert kernels and the dequantization kernel).

Formats (`FMT`): 0 Q4, 1 Q5, 2 Q6 (groups of 64), 3 W8 (groups of 32), 4 fp8 (128-lane blocks, one
fp32 scale per 128 x 128 block). `decode_group` returns the group's lanes in their natural order as
exact values of `cdt` and the rows' scales. Q4 / Q5 / Q6: byte j of a group's base plane holds lanes
2j (low nibble) and 2j + 1 (high nibble), rejoined in registers (`tl.join`); the high bits come from
the group's high-plane words, loaded as int32 (Q5: 2 words, bit i is lane i's bit 4; Q6: 4 words,
bits 2i, 2i + 1 are lane i's bits 4, 5), so a row's group is three short contiguous loads. With
`BF16_MAGIC` the Q4 / Q5 / Q6 values are bf16 128 + SIGN + q (bit operations only, no conversion
instruction) and the caller subtracts (128 + SIGN) * sum(x) after its dot; with `MAGIC` (fp32
values) offset | 0x4B000000 read as fp32 is 2^23 + offset, minus 2^23 + SIGN exactly.
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
    elif MAGIC:
        v = ((off | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + SIGN)).to(cdt)
    else:
        v = (off - SIGN).to(cdt)
    return v


@triton.jit
def decode_group(
    base_ptr, high_ptr, scale_ptr,  # high_ptr: the high plane as int32 words (Q5 / Q6)
    prow, srow,  # [BN] int64: each row's plane row and scale row (fp8: its 128-row block)
    g, K,  # the group index along K; K (fp8 masks the lanes of a partial last block)
    sb, sh, ss,  # row strides of the base (bytes), high (int32 words) and scale planes
    FMT: tl.constexpr,
    MAGIC: tl.constexpr,
    BF16_MAGIC: tl.constexpr,
    cdt: tl.constexpr,
):  # fmt: skip
    """-> (w [BN, G] the group's lanes in order, s [BN] fp32 scales)."""
    BN: tl.constexpr = prow.shape[0]
    if FMT < 3:
        SIGN: tl.constexpr = 8 if FMT == 0 else (16 if FMT == 1 else 32)
        jj = tl.arange(0, 32)
        b = tl.load(base_ptr + prow[:, None] * sb + g * 32 + jj[None, :]).to(tl.int32)  # [BN, 32]
        u = tl.reshape(tl.join(b & 15, (b >> 4) & 15), (BN, 64))  # lane 2j, 2j + 1 <- byte j
        ii = tl.arange(0, 64)[None, :]
        if FMT == 1:  # Q5: two words a group, bit i of the 64 is lane i's bit 4
            w0, w1 = tl.split(tl.load(high_ptr + prow[:, None] * sh + g * 2 + tl.arange(0, 2)[None, :]))
            word = tl.where(ii < 32, w0[:, None], w1[:, None])
            u = u | (((word >> (ii % 32)) & 1) << 4)
        if FMT == 2:  # Q6: four words a group, bits 2i, 2i + 1 of the 128 are lane i's bits 4, 5
            hrow = high_ptr + prow[:, None] * sh + g * 4 + tl.arange(0, 2)[None, :]
            w0, w1 = tl.split(tl.load(hrow))  # words 0, 1 and 2, 3: two 8-byte loads a row
            w2, w3 = tl.split(tl.load(hrow + 2))
            q = ii // 16
            word = tl.where(
                q < 2, tl.where(q == 0, w0[:, None], w1[:, None]), tl.where(q == 2, w2[:, None], w3[:, None])
            )
            u = u | (((word >> ((2 * ii) % 32)) & 3) << 4)
        w = _values(u, SIGN, MAGIC, BF16_MAGIC, cdt)
        s = tl.load(scale_ptr + srow * ss + g).to(tl.float32)
    else:
        G: tl.constexpr = 32 if FMT == 3 else 128
        kk = g * G + tl.arange(0, G)
        if FMT == 3:
            q8 = tl.load(base_ptr + prow[:, None] * sb + kk[None, :]).to(tl.int8, bitcast=True)
            w = q8.to(cdt)
            s = tl.load(scale_ptr + srow * ss + g).to(tl.float32)
        else:  # lanes past K (a partial last block) are masked (a clamped index would not vectorize)
            f8 = tl.load(base_ptr + prow[:, None] * sb + kk[None, :], mask=kk[None, :] < K, other=0.0)
            w = f8.to(cdt)
            s = tl.load(scale_ptr + srow * ss + g)
    return w, s


@triton.jit
def decode_group_parity(
    base_ptr, high_ptr, scale_ptr, prow, srow, g, sb, sh, ss,
    FMT: tl.constexpr, MAGIC: tl.constexpr, BF16_MAGIC: tl.constexpr, cdt: tl.constexpr,
):  # fmt: skip
    """Q4 / Q5 / Q6 only: -> (w_even [BN, 32], w_odd [BN, 32], s [BN]): the group's even lanes 2j
    (low nibbles of its base bytes) and odd lanes 2j + 1 (high nibbles), no register shuffle of the
    codes; the caller splits x the same way."""
    SIGN: tl.constexpr = 8 if FMT == 0 else (16 if FMT == 1 else 32)
    jj = tl.arange(0, 32)[None, :]
    b = tl.load(base_ptr + prow[:, None] * sb + g * 32 + jj).to(tl.int32)  # [BN, 32]
    ue = b & 15
    uo = (b >> 4) & 15
    if FMT == 1:  # lane i's bit 4 is bit i of the group's 64: even lanes bit 2j, odd 2j + 1
        w0, w1 = tl.split(tl.load(high_ptr + prow[:, None] * sh + g * 2 + tl.arange(0, 2)[None, :]))
        word = tl.where(jj < 16, w0[:, None], w1[:, None])
        sh_e = (2 * jj) % 32
        ue = ue | (((word >> sh_e) & 1) << 4)
        uo = uo | (((word >> (sh_e + 1)) & 1) << 4)
    if FMT == 2:  # lane i's bits 4, 5 are bits 2i, 2i + 1 of the group's 128: word i // 16
        hrow = high_ptr + prow[:, None] * sh + g * 4 + tl.arange(0, 2)[None, :]
        w0, w1 = tl.split(tl.load(hrow))
        w2, w3 = tl.split(tl.load(hrow + 2))
        q = jj // 8  # lanes 2j, 2j + 1 share word j // 8
        word = tl.where(q < 2, tl.where(q == 0, w0[:, None], w1[:, None]), tl.where(q == 2, w2[:, None], w3[:, None]))
        sh_e = (4 * jj) % 32
        ue = ue | (((word >> sh_e) & 3) << 4)
        uo = uo | (((word >> (sh_e + 2)) & 3) << 4)
    s = tl.load(scale_ptr + srow * ss + g).to(tl.float32)
    return _values(ue, SIGN, MAGIC, BF16_MAGIC, cdt), _values(uo, SIGN, MAGIC, BF16_MAGIC, cdt), s
