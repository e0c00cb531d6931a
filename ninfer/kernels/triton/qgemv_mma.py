"""Decode GEMV / small GEMM for Q4 / Q5 / Q6 on the tensor cores (Gluon, sm_80+, bf16 x):
y[M, N] = x[M, K] @ dequant(W)[N, K]^T for M <= 8.

Each warp runs `mma.sync.m16n8k16` (bf16 in, fp32 accumulate) with the weights as the A operand
(16 rows) and x as the B operand (8 columns: the batch rows, zero past M). The register fragments
are built by each thread from what it loads itself, so no layout conversion exists anywhere:

- thread (g, q) of a warp (lane 4g + q) loads words 2q, 2q + 1 of a scale group (8 bytes) for rows
  g and g + 8 of its tile (a warp reads 8 rows x 32 contiguous bytes a load: whole sectors);
- a word's 8 nibbles become four bf16x2 registers, pairs of lanes (j, j + 4) for j = 0..3: one
  LOP3 each (mask, exponent, sign flip in one) on the word shifted by 4 j, giving 128 + (q + SIGN),
  and one packed `fma.rn.bf16x2` subtracting 128 + SIGN, exact (small integers). Q5 / Q6 put their
  high bits into the same registers (a multiply spreads them to both halves);
- the mma's k order is a permutation of the group's lanes (thread q's lanes j, j + 4, j + 1, j + 5
  of one of its two words), and x is loaded in the same permutation (pairs of bf16 repacked with
  PRMT), so every k of one mma lies in one scale group: C per group, then acc += scale * C in fp32.

Decoding costs about 1.4 instructions a weight (0.6 on the integer pipe) and the products nothing on
the CUDA cores, against 4 (Q4) and 6.3 (Q5 / Q6) in `qgemv_lanes`. The sums are exact products
accumulated in fp32 by the tensor cores, one group at a time. Gluon kernels have no interpreter:
the CPU runs `qgemv`'s other kernels; this one is checked on the GPU (`tests/kernels/test_qgemv.py`
compiled, `ops/bench/qgemv_micro.py` against the dequantized product before timing) and its sm_90
build in `tests/kernels/test_qgemv_mma.py`.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ninfer.formats import QuantWeight
from ninfer.kernels.triton.qgemv_lanes import pdl_enter

MAX_ROWS = 8  # the mma's N: batch rows of x
TILE_ROWS = 16  # the mma's M: rows of W a warp tile


@gluon.jit
def _pairs_q4(w):
    """A Q4 word -> 4 bf16x2 (lanes j, j + 4 as signed values), j = 0..3."""
    return gl.inline_asm_elementwise(
        """{ .reg .b32 t, m, c, one, neg;
        mov.b32 m, 0x000F000F; mov.b32 c, 0x43084308; mov.b32 one, 0x3F803F80; mov.b32 neg, 0xC308C308;
        lop3.b32 t, $4, m, c, 0x6A; fma.rn.bf16x2 $0, t, one, neg;
        shr.u32 t, $4, 4; lop3.b32 t, t, m, c, 0x6A; fma.rn.bf16x2 $1, t, one, neg;
        shr.u32 t, $4, 8; lop3.b32 t, t, m, c, 0x6A; fma.rn.bf16x2 $2, t, one, neg;
        shr.u32 t, $4, 12; lop3.b32 t, t, m, c, 0x6A; fma.rn.bf16x2 $3, t, one, neg; }""",
        "=r,=r,=r,=r,r", [w], dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1,
    )  # fmt: skip


@gluon.jit
def _pairs_q5(w, h):
    """A Q5 word and its high byte (bit i: lane i's bit 4) -> 4 bf16x2 of signed values."""
    return gl.inline_asm_elementwise(
        """{ .reg .b32 t, u, m, mh, c, one, neg;
        mov.b32 m, 0x000F000F; mov.b32 mh, 0x00100010; mov.b32 c, 0x43104310;
        mov.b32 one, 0x3F803F80; mov.b32 neg, 0xC310C310;
        and.b32 u, $5, 0x11; mul.lo.u32 u, u, 0x10010; lop3.b32 u, u, mh, c, 0x6A;
        lop3.b32 t, $4, m, u, 0xEA; fma.rn.bf16x2 $0, t, one, neg;
        shr.u32 u, $5, 1; and.b32 u, u, 0x11; mul.lo.u32 u, u, 0x10010; lop3.b32 u, u, mh, c, 0x6A;
        shr.u32 t, $4, 4; lop3.b32 t, t, m, u, 0xEA; fma.rn.bf16x2 $1, t, one, neg;
        shr.u32 u, $5, 2; and.b32 u, u, 0x11; mul.lo.u32 u, u, 0x10010; lop3.b32 u, u, mh, c, 0x6A;
        shr.u32 t, $4, 8; lop3.b32 t, t, m, u, 0xEA; fma.rn.bf16x2 $2, t, one, neg;
        shr.u32 u, $5, 3; and.b32 u, u, 0x11; mul.lo.u32 u, u, 0x10010; lop3.b32 u, u, mh, c, 0x6A;
        shr.u32 t, $4, 12; lop3.b32 t, t, m, u, 0xEA; fma.rn.bf16x2 $3, t, one, neg; }""",
        "=r,=r,=r,=r,r,r", [w, h], dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1,
    )  # fmt: skip


@gluon.jit
def _pairs_q6(w, h):
    """A Q6 word and its high halfword (bits 2i, 2i + 1: lane i's bits 4, 5) -> 4 bf16x2."""
    return gl.inline_asm_elementwise(
        """{ .reg .b32 t, u, m, mh, c, one, neg;
        mov.b32 m, 0x000F000F; mov.b32 mh, 0x00300030; mov.b32 c, 0x43204320;
        mov.b32 one, 0x3F803F80; mov.b32 neg, 0xC320C320;
        and.b32 u, $5, 0x0303; mul.lo.u32 u, u, 0x1010; lop3.b32 u, u, mh, c, 0x6A;
        lop3.b32 t, $4, m, u, 0xEA; fma.rn.bf16x2 $0, t, one, neg;
        shr.u32 u, $5, 2; and.b32 u, u, 0x0303; mul.lo.u32 u, u, 0x1010; lop3.b32 u, u, mh, c, 0x6A;
        shr.u32 t, $4, 4; lop3.b32 t, t, m, u, 0xEA; fma.rn.bf16x2 $1, t, one, neg;
        shr.u32 u, $5, 4; and.b32 u, u, 0x0303; mul.lo.u32 u, u, 0x1010; lop3.b32 u, u, mh, c, 0x6A;
        shr.u32 t, $4, 8; lop3.b32 t, t, m, u, 0xEA; fma.rn.bf16x2 $2, t, one, neg;
        shr.u32 u, $5, 6; and.b32 u, u, 0x0303; mul.lo.u32 u, u, 0x1010; lop3.b32 u, u, mh, c, 0x6A;
        shr.u32 t, $4, 12; lop3.b32 t, t, m, u, 0xEA; fma.rn.bf16x2 $3, t, one, neg; }""",
        "=r,=r,=r,=r,r,r", [w, h], dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1,
    )  # fmt: skip


@gluon.jit
def _pairs(w, h, FMT: gl.constexpr):
    if FMT == 0:
        p = _pairs_q4(w)
    elif FMT == 1:
        p = _pairs_q5(w, h)
    else:
        p = _pairs_q6(w, h)
    return p


@gluon.jit
def _prmt(a, b, SEL: gl.constexpr):
    """Two bf16 halves of a and b into one register (SEL 0x5410: low halves, 0x7632: high halves)."""
    if SEL == 0x5410:
        r = gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r", [a, b], dtype=gl.int32, is_pure=True, pack=1)
    else:
        r = gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7632;", "=r,r,r", [a, b], dtype=gl.int32, is_pure=True, pack=1)
    return r


@gluon.jit
def _mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """One m16n8k16 bf16 mma of the warp: each thread's fragment registers in, its C fragment out."""
    return gl.inline_asm_elementwise(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
        [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
        dtype=(gl.float32, gl.float32, gl.float32, gl.float32),
        is_pure=True,
        pack=1,
    )  # fmt: skip


@gluon.jit
def qgemv_mma_kernel(
    x_ptr, base_ptr, high_ptr, scale_ptr, y_ptr,  # x_ptr: x as int32 bf16 pairs [M, K / 2]
    M, N, K, GROUPS, G_PER_SPLIT,
    sx, sb, sh, ss, sy_split, sy,  # row strides: x (int32 pairs), base (int32 words), high, scales
    FMT: gl.constexpr,  # 0 Q4, 1 Q5, 2 Q6
    T: gl.constexpr,  # 16-row tiles a warp
    WARPS: gl.constexpr,
    GPI: gl.constexpr,  # scale groups an iteration (unrolled)
    EVEN_K: gl.constexpr,  # K a multiple of 64: no lane of x is masked
    PDL: gl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    WT: gl.constexpr = WARPS * T
    BLOCK_N: gl.constexpr = WT * 16
    L4: gl.constexpr = gl.BlockedLayout([T, 1, 1, 2], [1, 8, 4, 1], [WARPS, 1, 1, 1], [3, 2, 1, 0])
    L3: gl.constexpr = gl.SliceLayout(3, L4)  # [WT, 8, 4]: one value a thread a tile
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    tt = gl.expand_dims(gl.expand_dims(gl.arange(0, WT, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3))), 1), 2)
    gg = gl.expand_dims(gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3))), 0), 2)
    qq = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3))), 0), 1)
    row_lo = pid_n * BLOCK_N + tt * 16 + gg  # [WT, 8, 1]
    row_hi = row_lo + 8
    r_lo = gl.minimum(row_lo, N - 1).to(gl.int64)  # rows past the end are read again, never stored
    r_hi = gl.minimum(row_hi, N - 1).to(gl.int64)
    ee = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L4)))), 0), 1), 2)
    wq = gl.expand_dims(qq, 3) * 2 + ee  # [1, 1, 4, 2]: words 2q, 2q + 1 of a group
    w_lo_ptr = base_ptr + gl.expand_dims(r_lo, 3) * sb + wq
    w_hi_ptr = base_ptr + gl.expand_dims(r_hi, 3) * sb + wq
    h_lo_ptr = high_ptr + gl.expand_dims(r_lo, 3) * sh + wq
    h_hi_ptr = high_ptr + gl.expand_dims(r_hi, 3) * sh + wq
    # x: column g of the mma is batch row g; pairs (2u, 2u + 1) of lanes of words 2q, 2q + 1
    xcol = gl.minimum(gg, M - 1).to(gl.int64)  # [1, 8, 1]
    xrow_ptr = x_ptr + xcol * sx + qq * 8  # int32 index of word 2q's first pair
    zero = gl.zeros([WT, 8, 4], gl.float32, L3)
    acc0 = zero
    acc1 = zero
    acc2 = zero
    acc3 = zero
    g_lo = pid_k * G_PER_SPLIT
    g_hi = gl.minimum(g_lo + G_PER_SPLIT, GROUPS)
    for g0 in range(g_lo, g_hi, GPI):
        for gu in gl.static_range(GPI):  # unrolled: the groups' loads are in flight together
            gi = gl.minimum(g0 + gu, g_hi - 1)  # past the split's end: read again, counted 0
            live = g0 + gu < g_hi
            w_lo0, w_lo1 = gl.split(gl.load(w_lo_ptr + gi * 8).to(gl.uint32, bitcast=True))  # [WT, 8, 4] each
            w_hi0, w_hi1 = gl.split(gl.load(w_hi_ptr + gi * 8).to(gl.uint32, bitcast=True))
            if FMT == 1:
                h_lo0, h_lo1 = gl.split(gl.load(h_lo_ptr + gi * 8).to(gl.uint8, bitcast=True).to(gl.uint32))
                h_hi0, h_hi1 = gl.split(gl.load(h_hi_ptr + gi * 8).to(gl.uint8, bitcast=True).to(gl.uint32))
            elif FMT == 2:
                h_lo0, h_lo1 = gl.split(gl.load(h_lo_ptr + gi * 8).to(gl.uint16, bitcast=True).to(gl.uint32))
                h_hi0, h_hi1 = gl.split(gl.load(h_hi_ptr + gi * 8).to(gl.uint16, bitcast=True).to(gl.uint32))
            else:
                h_lo0 = w_lo0
                h_lo1 = w_lo1
                h_hi0 = w_hi0
                h_hi1 = w_hi1
            s_lo = gl.where(live, gl.load(scale_ptr + r_lo * ss + gi).to(gl.float32), 0.0)  # [WT, 8, 1]
            s_hi = gl.where(live, gl.load(scale_ptr + r_hi * ss + gi).to(gl.float32), 0.0)
            xp = xrow_ptr + gi * 32
            if EVEN_K:  # batch rows past M read row M - 1: their columns are computed and never stored
                u0 = gl.load(xp)
                u1 = gl.load(xp + 1)
                u2 = gl.load(xp + 2)
                u3 = gl.load(xp + 3)
                u4 = gl.load(xp + 4)
                u5 = gl.load(xp + 5)
                u6 = gl.load(xp + 6)
                u7 = gl.load(xp + 7)
            else:  # lanes past K are zero (their codes are zero; x there is not ours to read)
                k2 = gi * 32 + qq * 8
                u0 = gl.load(xp, mask=k2 < K // 2, other=0)
                u1 = gl.load(xp + 1, mask=k2 + 1 < K // 2, other=0)
                u2 = gl.load(xp + 2, mask=k2 + 2 < K // 2, other=0)
                u3 = gl.load(xp + 3, mask=k2 + 3 < K // 2, other=0)
                u4 = gl.load(xp + 4, mask=k2 + 4 < K // 2, other=0)
                u5 = gl.load(xp + 5, mask=k2 + 5 < K // 2, other=0)
                u6 = gl.load(xp + 6, mask=k2 + 6 < K // 2, other=0)
                u7 = gl.load(xp + 7, mask=k2 + 7 < K // 2, other=0)
            # x pairs (lanes j, j + 4) of words 2q (x0*) and 2q + 1 (x1*), as the weights' pairs
            x00 = _prmt(u0, u2, 0x5410)
            x01 = _prmt(u0, u2, 0x7632)
            x02 = _prmt(u1, u3, 0x5410)
            x03 = _prmt(u1, u3, 0x7632)
            x10 = _prmt(u4, u6, 0x5410)
            x11 = _prmt(u4, u6, 0x7632)
            x12 = _prmt(u5, u7, 0x5410)
            x13 = _prmt(u5, u7, 0x7632)
            lo00, lo01, lo02, lo03 = _pairs(w_lo0, h_lo0, FMT)  # row g, word 2q: pairs j = 0..3
            lo10, lo11, lo12, lo13 = _pairs(w_lo1, h_lo1, FMT)  # row g, word 2q + 1
            hi00, hi01, hi02, hi03 = _pairs(w_hi0, h_hi0, FMT)  # row g + 8, word 2q
            hi10, hi11, hi12, hi13 = _pairs(w_hi1, h_hi1, FMT)
            # A fragment (a0: row g, k 2q..; a1: row g + 8; a2, a3: k 2q + 8..), B (b0: k 2q..; b1: k 2q + 8..)
            c0, c1, c2, c3 = _mma(lo00, hi00, lo01, hi01, x00, x01, zero, zero, zero, zero)
            c0, c1, c2, c3 = _mma(lo02, hi02, lo03, hi03, x02, x03, c0, c1, c2, c3)
            c0, c1, c2, c3 = _mma(lo10, hi10, lo11, hi11, x10, x11, c0, c1, c2, c3)
            c0, c1, c2, c3 = _mma(lo12, hi12, lo13, hi13, x12, x13, c0, c1, c2, c3)
            acc0 += s_lo * c0
            acc1 += s_lo * c1
            acc2 += s_hi * c2
            acc3 += s_hi * c3
    col = qq * 2  # [1, 1, 4]: C columns 2q, 2q + 1 are batch rows
    y_base = y_ptr + pid_k * sy_split
    out_lo = row_lo < N
    out_hi = row_hi < N
    gl.store(y_base + col * sy + row_lo, acc0.to(y_ptr.dtype.element_ty), mask=out_lo & (col < M))
    gl.store(y_base + (col + 1) * sy + row_lo, acc1.to(y_ptr.dtype.element_ty), mask=out_lo & (col + 1 < M))
    gl.store(y_base + col * sy + row_hi, acc2.to(y_ptr.dtype.element_ty), mask=out_hi & (col < M))
    gl.store(y_base + (col + 1) * sy + row_hi, acc3.to(y_ptr.dtype.element_ty), mask=out_hi & (col + 1 < M))


@functools.cache
def _has_bf16_mma(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (8, 0)


def supported(x: torch.Tensor, fmt: int) -> bool:
    """Whether `qgemv_mma` can take this call: Q4 / Q5 / Q6, bf16 x, sm_80 or newer, K even."""
    if fmt >= 3 or x.dtype != torch.bfloat16 or not x.is_cuda or x.shape[-1] % 2:
        return False
    return _has_bf16_mma(x.device.index if x.device.index is not None else torch.cuda.current_device())


def launch_mma(
    x2: torch.Tensor, w: QuantWeight, base32: torch.Tensor, high: torch.Tensor, out: torch.Tensor,
    fmt: int, m: int, n: int, k: int, groups: int, per_split: int, split: int, tiles: int, num_warps: int,
    gpi: int, pdl: dict[str, bool],
) -> None:  # fmt: skip
    """x2 [m, k] bf16 contiguous rows; out: y [m, n] or fp32 partials [split, m, n]."""
    x32 = x2.view(torch.int32)  # bf16 pairs
    grid = (triton.cdiv(n, num_warps * tiles * TILE_ROWS), split)
    qgemv_mma_kernel[grid](
        x32, base32, high, w.scale, out, m, n, k, groups, per_split,
        x32.stride(0), base32.stride(0), high.stride(0), w.scale.stride(0), 0 if split == 1 else m * n, n,
        FMT=fmt, T=tiles, WARPS=num_warps, GPI=gpi, EVEN_K=k % 64 == 0, num_warps=num_warps,
        PDL=pdl["PDL"], launch_pdl=pdl["launch_pdl"],
    )  # fmt: skip
