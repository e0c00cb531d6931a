"""Triton paged attention (float and int8 KV) vs a float64 reference (CPU interpreter; CUDA with TRITON_INTERPRET=0)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

from triton_refs import paged_attention as ref_attention

from ninfer.kernels import attention_ref
from ninfer.kernels.triton import (
    paged_attention,
    paged_attention_decode,
    quantize_kv_int8,
    write_kv_int8,
)

DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"
PAGE = 16  # the kernel takes any power of two >= 16; the engine uses 64


def _setup(lens, max_pages, nkv, hd, dtype, seed, num_pages=None):
    """Pools filled with random K/V, a random page permutation per sequence."""
    gen = torch.Generator().manual_seed(seed)
    num_pages = num_pages or len(lens) * max_pages + 2
    k_pool = torch.randn(num_pages, PAGE, nkv, hd, generator=gen).to(dtype).to(DEVICE)
    v_pool = torch.randn(num_pages, PAGE, nkv, hd, generator=gen).to(dtype).to(DEVICE)
    perm = torch.randperm(num_pages, generator=gen)[: len(lens) * max_pages]
    page_table = perm.reshape(len(lens), max_pages).to(torch.int32)
    for i, n in enumerate(lens):  # entries past a sequence's pages are -1, as the engine leaves them
        page_table[i, (n + PAGE - 1) // PAGE :] = -1
    return k_pool, v_pool, page_table.to(DEVICE)


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    ("lens", "nh", "nkv", "hd", "dtype", "splits"),
    [
        ([1, 17, 40], 4, 2, 32, torch.float32, 1),
        ([33, 5, 64], 6, 2, 32, torch.float32, 3),  # more splits than some sequences have pages
        ([20, 47], 4, 1, 24, torch.float32, 2),  # hd not a power of two
        ([9, 50, 31], 8, 2, 64, torch.bfloat16, 2),
    ],
)
def test_decode_matches_reference(lens, nh, nkv, hd, dtype, splits):
    max_pages = 4
    k_pool, v_pool, page_table = _setup(lens, max_pages, nkv, hd, dtype, seed=sum(lens))
    n = len(lens)
    q = torch.randn(n, nh, hd, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    seq_lens = torch.tensor(lens, device=DEVICE)
    out = torch.full((n, nh, hd), float("nan"), dtype=dtype, device=DEVICE)

    o = paged_attention_decode(q, k_pool, v_pool, page_table, seq_lens, num_splits=splits, out=out)

    assert o.data_ptr() == out.data_ptr() and o.dtype == dtype
    ref = ref_attention(
        q[:, None].cpu(), k_pool.cpu(), v_pool.cpu(), page_table.cpu(), seq_lens.cpu() - 1, hd**-0.5
    )
    torch.testing.assert_close(o.cpu().double(), ref[:, 0], **_tol(dtype))


def test_decode_padding_row_gives_zeros():
    k_pool, v_pool, page_table = _setup([12, 0, 30], 2, 2, 16, torch.float32, seed=5)
    q = torch.randn(3, 4, 16).to(DEVICE)
    seq_lens = torch.tensor([12, 0, 30], dtype=torch.int32, device=DEVICE)
    for splits in (1, 2):
        o = paged_attention_decode(q, k_pool, v_pool, page_table, seq_lens, num_splits=splits)
        assert torch.equal(o[1], torch.zeros_like(o[1]))
        ref = ref_attention(q[[0, 2], None].cpu(), k_pool.cpu(), v_pool.cpu(), page_table[[0, 2]].cpu(),
                            seq_lens[[0, 2]].cpu() - 1, 0.25)  # fmt: skip
        torch.testing.assert_close(o[[0, 2]].cpu().double(), ref[:, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("t", "splits"), [(4, 1), (3, 2), (21, 1)])
def test_prefill_with_history_matches_reference_and_reference_op(t, splits):
    cache = [0, 13, 30]
    nh, nkv, hd = 4, 2, 32
    k_pool, v_pool, page_table = _setup([c + t for c in cache], 4, nkv, hd, torch.float32, seed=t)
    q = torch.randn(len(cache), t, nh, hd, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    cache_lens = torch.tensor(cache, device=DEVICE)
    out = torch.full_like(q, float("nan"))

    o = paged_attention(q, k_pool, v_pool, page_table, cache_lens, 0.2, num_splits=splits, out=out)

    ref = ref_attention(q.cpu(), k_pool.cpu(), v_pool.cpu(), page_table.cpu(), cache_lens.cpu(), 0.2)
    torch.testing.assert_close(o.cpu().double(), ref, rtol=1e-5, atol=1e-5)
    ref_op = attention_ref.paged_attention(q, k_pool, v_pool, page_table, cache_lens, 0.2)
    torch.testing.assert_close(o, ref_op, rtol=1e-5, atol=1e-5)


def test_quantize_kv_int8_roundtrip():
    x = torch.randn(5, 3, 64, dtype=torch.bfloat16)
    x[1, 2] = 0
    xq, scale = quantize_kv_int8(x)
    assert xq.dtype == torch.int8 and scale.shape == (5, 3) and scale.dtype == torch.float32
    assert xq.abs().amax(-1).max() == 127 and torch.equal(xq[1, 2], torch.zeros(64, dtype=torch.int8))
    err = (xq.float() * scale[..., None] - x.float()).abs()
    assert torch.all(err <= scale[..., None] / 2 + 1e-7)  # round to nearest
    _, s16 = quantize_kv_int8(x, torch.float16)
    assert s16.dtype == torch.float16


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
def test_int8_kv_attention_close_to_bf16(scale_dtype):
    lens, nh, nkv, hd = [1, 30, 47], 4, 2, 64
    k_bf, v_bf, page_table = _setup(lens, 4, nkv, hd, torch.bfloat16, seed=9)
    num_pages = k_bf.shape[0]
    k_i8 = torch.zeros(num_pages, PAGE, nkv, hd, dtype=torch.int8, device=DEVICE)
    v_i8 = torch.zeros_like(k_i8)
    k_s = torch.zeros(num_pages, PAGE, nkv, dtype=scale_dtype, device=DEVICE)
    v_s = torch.zeros_like(k_s)
    n = len(lens)
    flat = page_table.long().clamp(min=0)
    keys = k_bf[flat].reshape(n, -1, nkv, hd)  # each sequence's keys in order
    vals = v_bf[flat].reshape(n, -1, nkv, hd)
    start = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    for i, length in enumerate(lens):  # prefill-style write, then the last token as a decode write
        pre = slice(0, length - 1)
        write_kv_int8(
            k_i8, v_i8, k_s, v_s, keys[i : i + 1, pre], vals[i : i + 1, pre], page_table[i : i + 1], start
        )
        last = slice(length - 1, length)
        write_kv_int8(k_i8, v_i8, k_s, v_s, keys[i : i + 1, last], vals[i : i + 1, last], page_table[i : i + 1],
                      start + length - 1)  # fmt: skip
    q = torch.randn(n, nh, hd, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).to(DEVICE)
    seq_lens = torch.tensor(lens, device=DEVICE)

    o_bf = paged_attention_decode(q, k_bf, v_bf, page_table, seq_lens)
    for splits in (1, 2):
        o_i8 = paged_attention_decode(
            q, k_i8, v_i8, page_table, seq_lens, k_scale=k_s, v_scale=v_s, num_splits=splits
        )
        err = (o_i8.float() - o_bf.float()).abs()
        # int8 rounding is at most amax/254 per element (~0.015 for a 1-token sequence, where the output
        # is that token's value); averaged over the sequence the error is far smaller
        assert err.max() < 2e-2 and err.norm() / o_bf.float().norm() < 1e-2, (err.max(), err.norm())
    # and exactly the attention over the dequantised pools
    k_dq = k_i8.double() * k_s.double()[..., None]
    v_dq = v_i8.double() * v_s.double()[..., None]
    ref = ref_attention(
        q[:, None].cpu(), k_dq.cpu(), v_dq.cpu(), page_table.cpu(), seq_lens.cpu() - 1, hd**-0.5
    )
    torch.testing.assert_close(o_i8.cpu().double(), ref[:, 0], rtol=2e-2, atol=1e-2)


def test_rejects_int8_without_scales():
    k = torch.zeros(2, PAGE, 1, 16, dtype=torch.int8, device=DEVICE)
    q = torch.zeros(1, 2, 16, device=DEVICE)
    pt = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="need k_scale and v_scale"):
        paged_attention_decode(q, k, k, pt, torch.ones(1, dtype=torch.int32, device=DEVICE))
