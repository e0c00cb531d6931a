"""The decode GEMV (`Ops.linear` of the triton backend) against torch.nn.functional.linear (CPU interpreter)."""

import dataclasses
import os
from unittest import mock

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

import triton

from ninfer.kernels import norm_ref
from ninfer.kernels.triton import backend, gates, gemv
from ninfer.kernels.triton import library as lib
from ninfer.kernels.triton.backend import triton_ops

DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"


def _r(*shape: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """fp32: within 1e-5 of the fp64 product; bf16/fp16: within one rounding of the output
    (the fp32-accumulated sum is rounded once, F.linear may round differently)."""
    exact = torch.nn.functional.linear(x.double(), w.double())
    assert y.dtype == x.dtype and y.shape == exact.shape
    assert torch.isfinite(y).all()
    if x.dtype == torch.float32:
        torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5)
    else:
        tol = torch.finfo(x.dtype).eps  # one rounding of |y|, plus slack for fp32 summation order
        assert ((y.double() - exact).abs() <= tol * exact.abs() + 1e-3 * exact.abs().max()).all()
        ref = torch.nn.functional.linear(x, w)
        torch.testing.assert_close(y.float(), ref.float(), rtol=2 * tol, atol=2e-3 * ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 16])
def test_rows_and_ragged_blocks(dtype: torch.dtype, m: int) -> None:
    """N and K not multiples of any block; the heuristic's config."""
    n, k = 37, 200
    x, w = _r(m, k, seed=m, dtype=dtype), _r(n, k, seed=100 + m, dtype=dtype)
    cfg = gemv.pick_config(m, n, k, dtype)
    assert cfg.use_dot == (m > 2 or (m == 2 and dtype != torch.float32))
    _check(gemv.gemv(x, w), x, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("use_dot", [False, True])
@pytest.mark.parametrize("split", [1, 3])
def test_single_pass_and_split_k_paths(dtype: torch.dtype, use_dot: bool, split: int) -> None:
    """Both inner products (CUDA-core broadcast, tensor-core dot) with one pass and with a split
    whose last part is short and whose K tail is masked (K = 300, block 64)."""
    m, n, k = 4, 50, 300
    x, w = _r(m, k, seed=1, dtype=dtype), _r(n, k, seed=2, dtype=dtype)
    cfg = gemv.GemvConfig(block_m=16 if use_dot else 4, block_n=16, block_k=64, split=split,
                          num_warps=4, num_stages=2, use_dot=use_dot)  # fmt: skip
    _check(gemv.gemv(x, w, cfg), x, w)


def test_even_k_split_and_single_row_n() -> None:
    """K a multiple of the block (unmasked loads), N = 1 (the shared-expert gate) and N = 48."""
    for n in (1, 48):
        x, w = _r(2, 512, seed=3, dtype=torch.bfloat16), _r(n, 512, seed=4 + n, dtype=torch.bfloat16)
        _check(gemv.gemv(x, w), x, w)
        x1 = x[:1]
        _check(gemv.gemv(x1, w), x1, w)


def test_heuristic_fills_the_gpu() -> None:
    """Split along K where N blocks alone leave SMs idle; one pass where the grid is already large."""
    for m in (1, 8):
        down = gemv.pick_config(m, 5120, 17408, torch.bfloat16)  # 27B down_proj
        assert (5120 // down.block_n) * down.split >= 2 * gemv.NUM_SMS
        assert gemv.pick_config(m, 48, 5120, torch.bfloat16).split > 1  # GDN b / a
        assert gemv.pick_config(m, 2048, 4096, torch.bfloat16).split > 1  # 35B-A3B out_proj
        assert gemv.pick_config(m, 248320, 5120, torch.bfloat16).split == 1  # lm_head


def test_split_k_is_deterministic() -> None:
    x, w = _r(3, 1024, seed=5, dtype=torch.float32), _r(20, 1024, seed=6, dtype=torch.float32)
    cfg = gemv.GemvConfig(16, 16, 64, split=5, num_warps=4, num_stages=2, use_dot=True)
    assert torch.equal(gemv.gemv(x, w, cfg), gemv.gemv(x, w, cfg))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_3d_input_and_strided_views(dtype: torch.dtype) -> None:
    """x [B, q, K] (verify rows) -> [B, q, N]; a weight that is a row slice of a merged weight
    (row stride > K) and an x whose rows are strided."""
    x = _r(2, 3, 96, seed=7, dtype=dtype)
    merged = _r(80, 96, seed=8, dtype=dtype)
    w = merged[10:43]  # contiguous rows of a merged projection
    y = lib.linear(x, w)
    assert y.shape == (2, 3, 33)
    _check(y.reshape(6, 33), x.reshape(6, 96), w)
    wide = _r(4, 200, seed=9, dtype=dtype)
    xs = wide[:, 8:104]  # row stride 200
    _check(gemv.gemv(xs, w), xs, w)
    wk = _r(96, 33, seed=10, dtype=dtype).T  # not contiguous along K: F.linear
    assert not gemv.use_gemv(x, wk)
    torch.testing.assert_close(lib.linear(x, wk), torch.nn.functional.linear(x, wk))


def test_dispatch_falls_back_to_f_linear() -> None:
    x17 = _r(17, 64, seed=11, dtype=torch.bfloat16)
    w = _r(40, 64, seed=12, dtype=torch.bfloat16)
    assert not gemv.use_gemv(x17, w)  # prefill rows
    assert torch.equal(lib.linear(x17, w), torch.nn.functional.linear(x17, w))
    assert gemv.use_gemv(x17[:1], w) and not gemv.use_gemv(x17[:16], w)  # N = 40 < 64 at 16 rows
    w64 = _r(64, 64, seed=15, dtype=torch.bfloat16)
    assert gemv.use_gemv(x17[:16], w64) and lib.linear(x17[:16], w64).shape == (16, 64)
    with pytest.raises(ValueError, match="at most 16 rows"):
        gemv.gemv(x17, w)
    assert not gemv.use_gemv(w[:1].to("meta"), w.to("meta"))  # not a kernel device
    mixed = w.float()
    assert not gemv.use_gemv(x17[:2], mixed)
    with pytest.raises(TypeError):
        gemv.gemv(x17[:2], mixed)


def test_size_policy_for_several_rows() -> None:
    """Where cuBLAS measured faster on the H200 it keeps the call (see `gemv.gemv_wins`)."""

    def uses(m: int, n: int, k: int) -> bool:
        x = torch.empty(m, k, dtype=torch.bfloat16, device=DEVICE)
        return gemv.use_gemv(x, torch.empty(1, k, dtype=torch.bfloat16, device=DEVICE).expand(n, k))

    assert uses(1, 5120, 6144) and uses(1, 16480, 5120) and uses(1, 5120, 17408)
    assert not uses(1, 9216, 2048)  # wide output over a short K
    assert uses(4, 1024, 2048) and uses(8, 257, 2048) and uses(2, 248320, 2048)
    assert not uses(2, 5120, 6144) and not uses(8, 34816, 5120) and not uses(4, 4096, 2048)
    assert uses(1, 1, 2048) and not uses(2, 1, 2048) and not uses(2, 32, 2048)


def test_backend_and_custom_op() -> None:
    ops = triton_ops()
    assert ops.linear is lib.linear
    x, w = _r(1, 2, 64, seed=13, dtype=torch.bfloat16), _r(24, 64, seed=14, dtype=torch.bfloat16)
    y = torch.ops.ninfer.gemv(x, w)
    assert y.shape == (1, 2, 24)
    _check(y.reshape(2, 24), x.reshape(2, 64), w)
    torch.library.opcheck(
        torch.ops.ninfer.gemv.default, (x, w), test_utils=("test_schema", "test_faketensor")
    )


def _gate_up(m: int, k: int, seed: int, dtype: torch.dtype, pad: int = 0) -> torch.Tensor:
    """gate | up [m, 2k]; pad > 0: a column slice of a wider tensor (rows strided by 2k + pad)."""
    wide = _r(m, 2 * k + pad, seed=seed, dtype=dtype) * 3  # silu's curved range, not only its tails
    return wide[:, pad // 2 : pad // 2 + 2 * k]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("m", "use_dot", "split", "k", "pad"),
    [
        (1, False, 1, 256, 0),  # one row on the CUDA cores, EVEN_K, one pass
        (3, False, 3, 300, 40),  # ragged K, split-K, strided rows
        (2, False, 2, 512, 24),  # EVEN_K split, strided rows
        (5, True, 1, 300, 0),  # several rows on tl.dot, ragged K, one pass
        (5, True, 4, 512, 8),  # tl.dot, EVEN_K split, strided rows
        (16, True, 3, 200, 16),  # 16 rows, ragged split
    ],
)
def test_swiglu_act_is_bit_identical_to_silu_mul_then_gemv(
    dtype: torch.dtype, m: int, use_dot: bool, split: int, k: int, pad: int
) -> None:
    """act="swiglu" on gate | up equals gates.silu_mul, then the plain GEMV (same config), bit for bit."""
    n = 40
    gu = _gate_up(m, k, seed=20 + m, dtype=dtype, pad=pad)
    w = _r(n, k, seed=30 + k, dtype=dtype) / k**0.5  # outputs O(1), like a trained down projection
    assert gu.is_contiguous() == (pad == 0)
    block_m = 16 if use_dot else triton.next_power_of_2(m)
    cfg = gemv.GemvConfig(block_m, 16, 64, split=split, num_warps=4, num_stages=2, use_dot=use_dot)
    act = gates.silu_mul(gu[:, :k], gu[:, k:])  # [m, k]
    fused = gemv.gemv(gu, w, cfg, act="swiglu")
    assert torch.equal(fused, gemv.gemv(act, w, cfg))
    _check(fused, act, w)
    ref = torch.nn.functional.linear(norm_ref.silu_mul(gu[:, :k], gu[:, k:]).double(), w.double())
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # torch's silu may round one product differently
    assert ((fused.double() - ref).abs().max() / ref.abs().max()).item() <= tol
    # the heuristic's config (act: the plain tiles and split, tl.dot tiles on >= 8 warps), rows [1, m, 2k]
    plain_cfg, act_cfg = gemv.pick_config(m, n, k, dtype), gemv.pick_config(m, n, k, dtype, act="swiglu")
    warps = 8 if plain_cfg.use_dot else plain_cfg.num_warps
    assert act_cfg == dataclasses.replace(plain_cfg, num_warps=warps)
    assert torch.equal(gemv.gemv(gu.unsqueeze(0), w, act="swiglu"), gemv.gemv(act, w).unsqueeze(0))


def test_swiglu_op_dispatch_and_errors() -> None:
    """`Ops.swiglu_linear` of the triton backend: the fused custom op where `linear` takes the GEMV
    (bit-identical to silu_mul + linear), silu_mul + F.linear elsewhere; the torch reference close."""
    ops = triton_ops()
    k, n = 96, 64
    w = _r(n, k, seed=40, dtype=torch.bfloat16)
    for m in (1, 4, 17):  # GEMV at 1 and 4 rows (n * k small), F.linear for 17
        gu = _gate_up(m, k, seed=41 + m, dtype=torch.bfloat16, pad=6).reshape(1, m, 2 * k)
        g, u = gu[..., :k], gu[..., k:]
        assert gemv.use_gemv(g, w) == (m <= 16)
        with mock.patch.object(lib, "swiglu_linear_op", wraps=lib.swiglu_linear_op) as fused:
            y = ops.swiglu_linear(gu, w)
        assert fused.call_count == (m <= 16)
        assert y.shape == (1, m, n)
        assert torch.equal(y, lib.linear(gates.silu_mul(g, u), w))
        ref = norm_ref.swiglu_linear(gu, w)
        torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.abs().max().item())
    gu = _gate_up(1, k, seed=45, dtype=torch.bfloat16)
    with (  # large down weights (the 27B's) keep the two launches: the fused GEMV measured slower there
        mock.patch.object(backend, "SWIGLU_FUSED_MAX_ELEMS", n * k - 1),
        mock.patch.object(lib, "swiglu_linear_op", wraps=lib.swiglu_linear_op) as fused,
    ):
        y = ops.swiglu_linear(gu, w)
    assert fused.call_count == 0 and torch.equal(y, lib.linear(gates.silu_mul(gu[:, :k], gu[:, k:]), w))
    x = _gate_up(2, k, seed=50, dtype=torch.bfloat16)
    torch.library.opcheck(
        torch.ops.ninfer.swiglu_linear.default, (x, w), test_utils=("test_schema", "test_faketensor")
    )
    for bad in (lambda: gemv.gemv(x[:, :k], w, act="swiglu"), lambda: ops.swiglu_linear(x[:, 1:], w),
                lambda: norm_ref.swiglu_linear(x[:, :-2], w)):  # fmt: skip
        with pytest.raises(ValueError, match=r"not gate \| up|do not chain"):
            bad()
    with pytest.raises(ValueError, match="act"):
        gemv.gemv(x, w, act="gelu")
