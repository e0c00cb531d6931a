"""The quantized GEMV (`Ops.qlinear` of the triton backend) against the dense product on the
dequantized weights (CPU interpreter; TRITON_INTERPRET=0 runs it compiled on a GPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import dataclasses

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

from ninfer.formats.weight import quantize
from ninfer.kernels.triton import qgemv

DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"
FORMATS = ["q4_g64", "q5_g64", "q6_g64", "q8_g32", "fp8_e4m3_b128"]


def _case(fmt: str, m: int, n: int, k: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = quantize(torch.randn(n, k, generator=g) * 0.05, fmt).to(DEVICE)
    x = torch.randn(m, k, generator=g).to(DEVICE, dtype)
    return x, w


def _check(y: torch.Tensor, x: torch.Tensor, w) -> None:
    """Against fp64 x @ dequant(w): fp32 within 1e-5; bf16 / fp16 within one output rounding."""
    exact = x.double() @ w.dequantize(torch.float64).T
    assert y.dtype == x.dtype and y.shape == exact.shape and torch.isfinite(y).all()
    if x.dtype == torch.float32:
        torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5 * float(exact.abs().max()))
    else:
        tol = torch.finfo(x.dtype).eps
        assert ((y.double() - exact).abs() <= tol * exact.abs() + 2e-3 * exact.abs().max()).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 3, 40])
def test_formats_and_rows(fmt: str, m: int) -> None:
    """Ragged N, a partial last group / block (K = 200, stored padded), the heuristic's config."""
    for dtype in (torch.float32, torch.bfloat16):
        x, w = _case(fmt, m, 37, 200, dtype, seed=m)
        _check(qgemv.qgemv(x, w), x, w)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("use_dot", "magic", "split", "gps", "parity"),
    [(False, False, 1, 1, False), (False, True, 3, 4, True), (True, False, 2, 3, False), (True, True, 1, 2, True)],
)
def test_inner_products_decodings_and_splits(
    fmt: str, use_dot: bool, magic: bool, split: int, gps: int, parity: bool
) -> None:
    """CUDA-core and tensor-core products, plain and bit-trick decoding (the bf16 one removes its
    offset after the dot), one pass and a split along K whose last part is short, unrolled groups
    that run past a split's end (counted 0), lanes rejoined or kept apart by parity."""
    for dtype in (torch.float32, torch.bfloat16):
        x, w = _case(fmt, 2, 70, 450, dtype, seed=7)
        cfg = qgemv.QGemvConfig(16 if use_dot else 2, 32, split, 4, 2, use_dot, magic, gps, parity)
        _check(qgemv.qgemv(x, w, cfg), x, w)


@pytest.mark.parametrize("fmt", FORMATS[:4])
@pytest.mark.parametrize(("words", "split", "block_n"), [(16, 1, 16), (64, 3, 32), (32, 2, 64)])
def test_word_kernel(fmt: str, words: int, split: int, block_n: int) -> None:
    """One row through `qgemv_words` (codes decoded a 32-bit word at a time straight into fp32
    mantissas): ragged N, K = 450 stored padded to 512 (a zero tail of codes and scales), chunks
    wider than a row narrowed to one that divides it, a split whose last part is short."""
    for dtype in (torch.float32, torch.bfloat16):
        x, w = _case(fmt, 1, 70, 450, dtype, seed=11)
        cfg = qgemv.QGemvConfig(1, block_n, split, 4, 2, False, True, 1, False, words=words)
        _check(qgemv.qgemv(x, w, cfg), x, w)


@pytest.mark.parametrize("fmt", FORMATS[:4])
@pytest.mark.parametrize(("k", "words", "split", "rows", "warps"), [(450, 64, 3, 2, 4), (1024, 128, 1, 4, 4), (2048, 128, 2, 4, 8)])
def test_lanes_kernel(fmt: str, k: int, words: int, split: int, rows: int, warps: int) -> None:
    """One row through `qgemv_lanes` (compiled: the Gluon kernel; in the interpreter its
    `qgemv_words` stand-in): a padded K (masked x lanes) and whole chunks, splits, ragged N."""
    for dtype in (torch.float32, torch.bfloat16):
        x, w = _case(fmt, 1, 70, k, dtype, seed=13)
        block_n = rows * warps
        cfg = qgemv.QGemvConfig(1, block_n, split, warps, 1, False, True, 1, False, words=words, thread_rows=rows)
        _check(qgemv.qgemv(x, w, cfg), x, w)


@pytest.mark.parametrize("fmt", FORMATS[:3])
@pytest.mark.parametrize(("m", "k", "split", "tiles", "warps", "gps"), [(1, 450, 1, 1, 4, 2), (3, 1024, 2, 2, 4, 2), (8, 2048, 3, 2, 8, 4), (8, 450, 2, 4, 4, 1)])
def test_mma_kernel(fmt: str, m: int, k: int, split: int, tiles: int, warps: int, gps: int) -> None:
    """Up to 8 rows through `qgemv_mma` (compiled, bf16: the Gluon tensor-core kernel; elsewhere its
    tensor-core Triton fallback): a padded K (masked x lanes), unrolled groups past a split's end,
    ragged N (70 rows: the last 16-row tile partly past the end)."""
    for dtype in (torch.float32, torch.bfloat16):
        x, w = _case(fmt, m, 70, k, dtype, seed=17 + m)
        cfg = qgemv.QGemvConfig(16, min(128, 16 * tiles * warps), split, warps, 1, True, True, gps, False, mma_tiles=tiles)
        _check(qgemv.qgemv(x, w, cfg), x, w)


def test_extreme_codes_and_zero_groups() -> None:
    """Every code value of each format appears (the signed ends included) and whole zero groups."""
    for fmt in FORMATS[:4]:
        bits = int(fmt[1])
        lo, hi = (-127, 127) if bits == 8 else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        row = torch.arange(lo, hi + 1, dtype=torch.float32).repeat(256 // (hi - lo + 1) + 1)[:256]
        wt = torch.stack([row, -row.flip(0), torch.zeros(256)])
        w = quantize(wt, fmt).to(DEVICE)
        x = torch.randn(1, 256, generator=torch.Generator().manual_seed(1)).to(DEVICE)
        for magic in (False, True):
            cfg = dataclasses.replace(qgemv.pick_config(1, 3, w.scale.shape[1], fmt, x.dtype), magic=magic)
            _check(qgemv.qgemv(x, w, cfg), x, w)
        _check(qgemv.qgemv(x, w, qgemv.QGemvConfig(1, 16, 1, 4, 2, False, True, 1, words=32)), x, w)
        _check(qgemv.qgemv(x, w, qgemv.QGemvConfig(1, 16, 1, 4, 1, False, True, 1, words=32, thread_rows=4)), x, w)
        if bits < 8:
            for xm in (x.bfloat16(), x.bfloat16().repeat(5, 1)):
                _check(qgemv.qgemv(xm, w, qgemv.QGemvConfig(16, 64, 1, 4, 1, True, True, 2, mma_tiles=1)), xm, w)


def test_bad_arguments() -> None:
    x, w = _case("q4_g64", 1, 8, 64, torch.float32, seed=0)
    with pytest.raises(ValueError, match="do not chain"):
        qgemv.qgemv(x[:, :32], w)
    with pytest.raises(ValueError, match="at most"):
        qgemv.qgemv(torch.zeros(qgemv.MAX_ROWS + 1, 64, device=DEVICE), w)
