"""Batch-1 groupwise GEMV over whole 32-bit words of codes (Triton): y[N] = dequant(W)[N, K] @ x[K].

Each program streams BLOCK_N rows of the base plane as int32 words (BKW words a row per loop
iteration: 16-byte vector loads), so every byte a step reads arrives in full lines. A word holds 8
lanes (Q4 / Q5 / Q6 nibbles: lane 8j + i is nibble i of word j) or 4 (W8 bytes: lane 4j + i is
byte i). Each lane is decoded with a shift and one logical op into an fp32 in [1, 2):

    v = 1 + n / MULT,   n = q + MULT / 2 (the code's offset form: its sign bit flipped),

its bits put straight into the mantissa (MULT = 16 / 32 / 64 / 256 for Q4 / Q5 / Q6 / W8: no
integer-to-float conversion, no magic to subtract). Then per word sum_i x_i q_i =
MULT * sum_i x_i v_i - 1.5 MULT * sum_i x_i, scaled by the word's group scale (8 words a group in
every format). The values v are exact; the offset removal costs a few bits of fp32 (the terms are
about 1.5 MULT sum x against sum x q), far below the bf16 output rounding.

High bits: Q5 byte j of the high plane holds bit 4 of word j's 8 lanes (bit i: lane i); Q6 halfword
j holds bits 4, 5 of word j's lanes (bits 2i, 2i + 1). Long K is split across programs into fp32
partials summed in a fixed order by a second launch, as in `qgemv`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer.kernels.triton.pdl import pdl_enter

WORDS_PER_GROUP = 8  # 64 nibble lanes or 32 byte lanes: the scale group of every groupwise format


@triton.jit
def _shift(w, s: tl.constexpr):
    """w << s for s >= 0, else w >> -s (arithmetic: the bits kept never come from the sign fill)."""
    if s >= 0:
        r = w << s
    else:
        r = w >> (-s)
    return r


@triton.jit
def _lane(w, h, i: tl.constexpr, FMT: tl.constexpr):
    """Lane i of words w (and their high bits h) -> fp32 v = 1 + n / MULT in [1, 2)."""
    if FMT == 0:  # Q4: n (4 bits) at mantissa bits 19..22
        bits = _shift(w, 19 - 4 * i) & 0x00780000
    elif FMT == 1:  # Q5: nibble at 18..21, bit 4 (high byte bit i) at 22
        bits = (_shift(w, 18 - 4 * i) & 0x003C0000) | (_shift(h, 22 - i) & 0x00400000)
    elif FMT == 2:  # Q6: nibble at 17..20, bits 4, 5 (high halfword bits 2i, 2i + 1) at 21, 22
        bits = (_shift(w, 17 - 4 * i) & 0x001E0000) | (_shift(h, 21 - 2 * i) & 0x00600000)
    else:  # W8: the byte at 15..22
        bits = _shift(w, 15 - 8 * i) & 0x007F8000
    return (bits ^ 0x3FC00000).to(tl.float32, bitcast=True)  # 1.0's exponent, the sign bit flipped


@triton.jit
def qgemv_words_kernel(
    x_ptr, base_ptr, high_ptr, scale_ptr, y_ptr,
    N, K, CHUNKS, C_PER_SPLIT,
    sb, sh, ss, sy_split,  # row strides: base (int32 words), high (bytes Q5 / halfwords Q6), scales
    FMT: tl.constexpr,  # 0 Q4, 1 Q5, 2 Q6, 3 W8
    BLOCK_N: tl.constexpr,
    BKW: tl.constexpr,  # words of each row per loop iteration
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    LANES: tl.constexpr = 8 if FMT < 3 else 4
    MULT: tl.constexpr = 16.0 if FMT == 0 else (32.0 if FMT == 1 else (64.0 if FMT == 2 else 256.0))
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)  # rows past the end are read again, never stored
    ww = tl.arange(0, BKW)
    c_lo = pid_k * C_PER_SPLIT
    c_hi = tl.minimum(c_lo + C_PER_SPLIT, CHUNKS)
    acc = tl.zeros([BLOCK_N, BKW], dtype=tl.float32)
    for c in range(c_lo, c_hi):
        wi = c * BKW + ww  # [BKW] word index along the row
        w = tl.load(base_ptr + rows[:, None] * sb + wi[None, :])  # [BN, BKW] int32
        if FMT == 1:
            h = tl.load(high_ptr + rows[:, None] * sh + wi[None, :]).to(tl.int32)  # one byte a word
        elif FMT == 2:
            h = tl.load(high_ptr + rows[:, None] * sh + wi[None, :]).to(tl.int32) & 0xFFFF  # a halfword
        else:
            h = w
        s = tl.load(scale_ptr + rows[:, None] * ss + (wi // 8)[None, :]).to(tl.float32)  # [BN, BKW]
        dot = tl.zeros([BLOCK_N, BKW], dtype=tl.float32)
        xs = tl.zeros([BKW], dtype=tl.float32)
        for i in tl.static_range(LANES):
            lane = wi * LANES + i
            xi = tl.load(x_ptr + lane, mask=lane < K, other=0.0).to(tl.float32)  # [BKW]
            xs += xi
            dot += _lane(w, h, i, FMT) * xi[None, :]
        acc += s * (MULT * dot - (1.5 * MULT) * xs[None, :])
    y = tl.sum(acc, axis=1)  # [BN]
    tl.store(y_ptr + pid_k * sy_split + offs_n, y.to(y_ptr.dtype.element_ty), mask=offs_n < N)


def row_words(fmt: int, kp: int) -> int:
    """Base-plane words of one row (kp: K padded to a multiple of 128 lanes)."""
    return kp // 8 if fmt < 3 else kp // 4


def chunk_words(words: int, row_words_: int) -> int:
    """The largest of words, words / 2, ..., 16 that divides a row (every row has a multiple of 16)."""
    bkw = triton.next_power_of_2(words)
    while bkw > 16 and row_words_ % bkw:
        bkw //= 2
    return bkw
