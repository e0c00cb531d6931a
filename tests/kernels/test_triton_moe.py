"""`moe_experts_small` (deduplicated gate/up and down, slot-order sum) against `moe_ref` on the CPU interpreter."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

from ninfer.kernels import moe_ref
from ninfer.kernels.triton import library, moe

DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"
DTYPES = [torch.float32, torch.bfloat16]


def _r(*shape: int, seed: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)


def _case(n: int, e: int, h: int, ie: int, k: int, dtype: torch.dtype, seed: int, pool: int | None = None):
    """Random inputs; every token's k distinct experts come from the first `pool` ids (forces sharing)."""
    gen = torch.Generator().manual_seed(seed)
    x = _r(n, h, seed=seed + 1, dtype=dtype)
    gate_up = _r(e, 2 * ie, h, seed=seed + 2, dtype=dtype, scale=h**-0.5)
    down = _r(e, h, ie, seed=seed + 3, dtype=dtype, scale=ie**-0.5)
    ids = torch.stack([torch.randperm(pool or e, generator=gen)[:k] for _ in range(n)]).to(DEVICE)
    w = torch.softmax(torch.randn(n, k, generator=gen), -1).to(DEVICE, dtype)
    return x, gate_up, down, ids, w


def _check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert torch.isfinite(out).all()
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    else:  # the reference adds experts in bf16 (ascending id), the kernel in fp32 (slot order)
        scale = ref.float().abs().max().item()
        torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2 * scale)


@pytest.mark.parametrize(
    ("dtype", "n"), [(torch.float32, n) for n in range(1, 9)] + [(torch.bfloat16, n) for n in (1, 3, 8)]
)
def test_decode_tokens_share_experts(dtype: torch.dtype, n: int) -> None:
    # 10 experts, top-4: tokens share experts; widths not multiples of the blocks
    x, gu, dn, ids, w = _case(n, e=12, h=80, ie=40, k=4, dtype=dtype, seed=10 * n, pool=10)
    out = moe.moe_experts_small(x, gu, dn, ids, w, block_n=16, block_k=32)
    _check(out, moe_ref.moe_experts(x, gu, dn, ids, w), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_token_same_experts(dtype: torch.dtype) -> None:
    x, gu, dn, ids, w = _case(5, e=8, h=64, ie=32, k=3, dtype=dtype, seed=3)
    ids = torch.stack([torch.tensor([6, 1, 3]).roll(i) for i in range(5)]).to(DEVICE)  # same set, other slots
    out = moe.moe_experts_small(x, gu, dn, ids, w)
    _check(out, moe_ref.moe_experts(x, gu, dn, ids, w), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_verify_sized(dtype: torch.dtype) -> None:
    """8 sequences x 6 draft positions = 48 tokens x top-8 = 384 rows (the op's limit), experts shared."""
    x, gu, dn, ids, w = _case(48, e=24, h=32, ie=16, k=8, dtype=dtype, seed=5)
    assert ids.numel() == moe.SMALL_MAX_ROWS
    out = moe.moe_experts_small(x, gu, dn, ids.to(torch.int32), w, block_n=32, block_k=32)
    _check(out, moe_ref.moe_experts(x, gu, dn, ids, w), dtype)


def test_most_tokens(dtype: torch.dtype = torch.bfloat16) -> None:
    """64 tokens (the op's limit: a 64-wide token tile) x top-6 = 384 rows over 16 experts (bf16:
    fp32 at 384 rows is `test_verify_sized`'s, and the interpreter takes ~15 s per dtype here)."""
    x, gu, dn, ids, w = _case(moe.SMALL_MAX_TOKENS, e=16, h=32, ie=16, k=6, dtype=dtype, seed=9)
    assert ids.numel() == moe.SMALL_MAX_ROWS
    out = moe.moe_experts_small(x, gu, dn, ids, w, block_n=16, block_k=16)  # two row tiles in down
    _check(out, moe_ref.moe_experts(x, gu, dn, ids, w), dtype)


def test_custom_op_default_config_strided_x() -> None:
    """Through the torch.library op, the shape heuristic's blocks, x a row-strided view."""
    x, gu, dn, ids, w = _case(3, e=16, h=96, ie=48, k=4, dtype=torch.float32, seed=7)
    wide = torch.zeros(3, 2 * 96, device=DEVICE)
    wide[:, :96] = x
    out = library.moe_experts_small(wide[:, :96], gu, dn, ids, w)
    _check(out, moe_ref.moe_experts(x, gu, dn, ids, w), torch.float32)


def test_config_heuristic() -> None:
    """35B-A3B shapes: >= 2 working programs per SM in both GEMMs (distinct experts x tiles), the
    widest tiles that still give them."""
    one = moe.pick_config(1, 8, 256, 2048, 512)
    assert (one.gate_up_bn, one.down_bn, one.down_bk) == (16, 32, 128)  # down: 8 experts x 64 tiles
    eight = moe.pick_config(8, 8, 256, 2048, 512)
    assert (eight.gate_up_bn, eight.down_bn) == (64, 64)  # down: ~57 experts x 32 tiles
    assert moe.pick_config(1, 8, 256, 2048, 512, elem_size=4).down_bk == 64
    assert moe.pick_config(8, 8, 256, 2048, 512, block_n=32, block_k=64).down_bk == 64


def test_rejects_what_it_cannot_compute() -> None:
    x, gu, dn, ids, w = _case(2, e=4, h=32, ie=16, k=2, dtype=torch.float32, seed=1)
    with pytest.raises(TypeError, match="share one of"):
        moe.moe_experts_small(x.double(), gu, dn, ids, w)
    with pytest.raises(ValueError, match="do not fit"):
        moe.moe_experts_small(x[:, :16], gu, dn, ids, w)
    many = torch.zeros(moe.SMALL_MAX_TOKENS + 1, 1, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="at most"):
        moe.moe_experts_small(x[:1].expand(len(many), -1), gu, dn, many, w[:1, :1].expand(len(many), 1))
