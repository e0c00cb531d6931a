"""Batch-1 groupwise GEMV with explicit register layouts (Gluon): y[N] = dequant(W)[N, K] @ x[K].

The same arithmetic as `qgemv_words` (each lane decoded into an fp32 in [1, 2) by bit operations,
the offset removed per word through the x sums, one scale a group), written in Gluon so that the
layouts are chosen here rather than by the compiler: `qgemv_words` spends most of its issue slots
moving x and the scales through shared memory to the weight tile's layout (barriers included), and
decoding with separate shift / mask / flip instructions. Here one four-dimensional layout
[rows, word quads, words, lanes] owns everything:

- a thread holds R rows x one quad of 4 consecutive words (one 16-byte load a row), and the 32
  (Q4 / Q5 / Q6) or 16 (W8) x values of those words, loaded once as contiguous vectors and shared
  by its R rows (x lives in the layout's slice over rows: no conversion);
- the 4 words of a quad sit in one scale group (8 words), so the scale is one load a row and quad;
- a lane is one rotate (`shf.l.wrap`) and one LOP3 (mask and flip in one), plus a select for the
  high bits of Q5 / Q6, then its FMA.

Measured on sm_90 SASS (R = 4, 4 warps): about 4 instructions a weight for Q4 and W8, 6.3 for Q5 /
Q6, no shared memory, against 6.8 and 20 barriers an iteration for Q4 in `qgemv_words`. Gluon
kernels have no CPU interpreter, so the interpreter (and the tests on the CPU) run `qgemv_words`;
both compute the same sums in the same fp32 order per word (`tests/kernels/test_qgemv_lanes.py`
compiles every format for sm_90; `ops/bench/qgemv_micro.py` checks each against the dequantized
reference on the GPU before timing it).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ninfer.formats import QuantWeight

QUAD = 4  # words a thread loads of each row per iteration (16 bytes)
FLIP = 0x3FC00000  # 1.0's exponent with the top code bit flipped: v = 1 + (q + MULT / 2) / MULT


@gluon.jit
def pdl_enter(PDL: gl.constexpr):
    """`pdl.pdl_enter` for Gluon: trigger the dependents, then wait for the kernel before."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _rotl(w, r):
    """Rotate the uint32 words w left by r (a tensor of amounts in 0..31, constant per lane)."""
    return gl.inline_asm_elementwise("shf.l.wrap.b32 $0, $1, $1, $2;", "=r,r,r", [w, r], dtype=gl.uint32, is_pure=True, pack=1)


@gluon.jit
def _select_q5(w, h, ra, rb):
    """(rotl(w, ra) & 0x3C0000) | (rotl(h, rb) & ~0x3C0000): a Q5 code's nibble from w, bit 4 from h."""
    return gl.inline_asm_elementwise(
        "{ .reg .b32 a, b; shf.l.wrap.b32 a, $1, $1, $3; shf.l.wrap.b32 b, $2, $2, $4; lop3.b32 $0, a, b, 0x3C0000, 0xE4; }",
        "=r,r,r,r,r", [w, h, ra, rb], dtype=gl.uint32, is_pure=True, pack=1,
    )  # fmt: skip


@gluon.jit
def _select_q6(w, h, ra, rb):
    """(rotl(w, ra) & 0x1E0000) | (rotl(h, rb) & ~0x1E0000): a Q6 code's nibble from w, bits 4, 5 from h."""
    return gl.inline_asm_elementwise(
        "{ .reg .b32 a, b; shf.l.wrap.b32 a, $1, $1, $3; shf.l.wrap.b32 b, $2, $2, $4; lop3.b32 $0, a, b, 0x1E0000, 0xE4; }",
        "=r,r,r,r,r", [w, h, ra, rb], dtype=gl.uint32, is_pure=True, pack=1,
    )  # fmt: skip


@gluon.jit
def qgemv_lanes_kernel(
    x_ptr, base_ptr, high_ptr, scale_ptr, y_ptr,
    N, K, CHUNKS, C_PER_SPLIT,
    sb, sh, ss, sy_split, flip,  # row strides: base (int32 words), high (bytes Q5 / halfwords Q6), scales
    FMT: gl.constexpr,  # 0 Q4, 1 Q5, 2 Q6, 3 W8
    R: gl.constexpr,  # rows a thread
    Q: gl.constexpr,  # word quads of a row an iteration (BKW = 4 Q words)
    WARPS: gl.constexpr,
    EVEN_K: gl.constexpr,  # K is the padded row length: no lane of x is masked (vector loads)
    PDL: gl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    LANES: gl.constexpr = 8 if FMT < 3 else 4
    MULT: gl.constexpr = 16.0 if FMT == 0 else (32.0 if FMT == 1 else (64.0 if FMT == 2 else 256.0))
    TR: gl.constexpr = 32 // Q  # threads of a warp along rows when a row's iteration has fewer than 32 quads
    BLOCK_N: gl.constexpr = R * TR * WARPS
    BKW: gl.constexpr = Q * 4
    L4: gl.constexpr = gl.BlockedLayout([R, 1, 4, LANES], [TR, Q, 1, 1], [WARPS, 1, 1, 1], [3, 2, 1, 0])
    L3: gl.constexpr = gl.SliceLayout(3, L4)  # [BN, Q, 4] words
    L2: gl.constexpr = gl.SliceLayout(2, L3)  # [BN, Q] a scale each
    X3: gl.constexpr = gl.SliceLayout(0, L4)  # [Q, 4, LANES] x, shared by a thread's rows
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, L2))
    rows = gl.minimum(offs_n, N - 1).to(gl.int64)  # rows past the end are read again, never stored
    r2 = gl.expand_dims(rows, 1)  # [BN, 1]
    r3 = gl.expand_dims(r2, 2)  # [BN, 1, 1]
    q2 = gl.expand_dims(gl.arange(0, Q, layout=gl.SliceLayout(0, L2)), 0)  # [1, Q]
    j3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3))), 0), 1)
    wcol = gl.expand_dims(q2, 2) * 4 + j3  # [1, Q, 4] the word's index in the chunk
    xq = gl.expand_dims(gl.expand_dims(gl.arange(0, Q, layout=gl.SliceLayout(1, gl.SliceLayout(2, X3))), 1), 2)
    xj = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, X3))), 0), 2)
    xl = gl.expand_dims(gl.expand_dims(gl.arange(0, LANES, layout=gl.SliceLayout(0, gl.SliceLayout(1, X3))), 0), 1)
    xoff = (xq * 4 + xj) * LANES + xl  # [Q, 4, LANES]: lane l of word (q, j)
    LL: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L4)))
    ll = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.arange(0, LANES, layout=LL), 0), 1), 2)  # [1, 1, 1, L]
    if FMT == 0:  # rotate lane l's nibble to bits 19..22
        ra = ((19 - 4 * ll) & 31).to(gl.uint32)
    elif FMT == 1:  # nibble to 18..21; the high byte's bit l to 22
        ra = ((18 - 4 * ll) & 31).to(gl.uint32)
        rb = ((22 - ll) & 31).to(gl.uint32)
    elif FMT == 2:  # nibble to 17..20; the high halfword's bits 2l, 2l + 1 to 21, 22
        ra = ((17 - 4 * ll) & 31).to(gl.uint32)
        rb = ((21 - 2 * ll) & 31).to(gl.uint32)
    else:  # byte l to 15..22
        ra = ((15 - 8 * ll) & 31).to(gl.uint32)
    c_lo = pid_k * C_PER_SPLIT
    c_hi = gl.minimum(c_lo + C_PER_SPLIT, CHUNKS)
    acc = gl.zeros([BLOCK_N, Q], gl.float32, L2)
    for c in range(c_lo, c_hi):
        w = gl.expand_dims(gl.load(base_ptr + r3 * sb + c * BKW + wcol).to(gl.uint32, bitcast=True), 3)
        s = gl.load(scale_ptr + r2 * ss + c * (BKW // 8) + q2 // 2).to(gl.float32)  # [BN, Q]
        lane = c * (BKW * LANES) + xoff
        if EVEN_K:
            x = gl.load(x_ptr + lane).to(gl.float32)  # [Q, 4, LANES]
        else:
            x = gl.load(x_ptr + lane, mask=lane < K, other=0.0).to(gl.float32)
        xs = gl.sum(gl.sum(x, axis=2), axis=1)  # [Q]
        if FMT == 0:
            bits = _rotl(w, ra) & 0x00780000
        elif FMT == 1:
            h = gl.load(high_ptr + r3 * sh + c * BKW + wcol).to(gl.uint8, bitcast=True).to(gl.uint32)
            bits = _select_q5(w, gl.broadcast(gl.expand_dims(h, 3), ra)[0], ra, rb) & 0x007C0000
        elif FMT == 2:
            h = gl.load(high_ptr + r3 * sh + c * BKW + wcol).to(gl.uint16, bitcast=True).to(gl.uint32)
            bits = _select_q6(w, gl.broadcast(gl.expand_dims(h, 3), ra)[0], ra, rb) & 0x007E0000
        else:
            bits = _rotl(w, ra) & 0x007F8000
        v = (bits.to(gl.int32, bitcast=True) ^ flip).to(gl.float32, bitcast=True)  # [BN, Q, 4, L] in [1, 2)
        dot = gl.sum(gl.sum(v * gl.expand_dims(x, 0), axis=3), axis=2)  # [BN, Q]
        xq2 = gl.expand_dims(gl.convert_layout(xs, gl.SliceLayout(0, L2)), 0)  # [1, Q] (same registers)
        acc += s * (MULT * dot - (1.5 * MULT) * xq2)
    y = gl.sum(acc, axis=1)  # [BN]
    gl.store(y_ptr + pid_k * sy_split + offs_n, y.to(y_ptr.dtype.element_ty), mask=offs_n < N)


def block_rows(thread_rows: int, quads: int, num_warps: int) -> int:
    """Rows of W one program covers."""
    return thread_rows * (32 // quads) * num_warps


def launch_lanes(
    x2: torch.Tensor, w: QuantWeight, base32: torch.Tensor, high: torch.Tensor, out: torch.Tensor,
    fmt: int, n: int, k: int, bkw: int, thread_rows: int, num_warps: int, split: int, pdl: dict[str, bool],
) -> int:  # fmt: skip
    """Launch over `split` programs along K (out: y, or [split, 1, n] fp32 partials); -> the split used."""
    quads = bkw // QUAD
    rw = base32.shape[1]
    chunks = rw // bkw
    per_split = triton.cdiv(chunks, max(1, min(split, chunks)))
    split = triton.cdiv(chunks, per_split)
    grid = (triton.cdiv(n, block_rows(thread_rows, quads, num_warps)), split)
    qgemv_lanes_kernel[grid](
        x2, base32, high, w.scale, out, n, k, chunks, per_split,
        base32.stride(0), high.stride(0), w.scale.stride(0), 0 if split == 1 else n, FLIP,
        FMT=fmt, R=thread_rows, Q=quads, WARPS=num_warps, EVEN_K=k == rw * (8 if fmt < 3 else 4),
        num_warps=num_warps, PDL=pdl["PDL"],
        launch_pdl=pdl["launch_pdl"],
    )  # fmt: skip
    return split
