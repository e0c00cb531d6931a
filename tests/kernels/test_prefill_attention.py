"""Prefill-with-history attention (gather + SDPA, lower-right causal) equals the torch reference."""

import pytest
import torch

from ninfer.kernels import attention_ref
from ninfer.kernels.kv_quant import quantize_kv_int8
from ninfer.kernels.triton import prefill_attention as pa


def pools(num_pages: int, nkv: int, hd: int, int8: bool, gen: torch.Generator):
    k = torch.randn(num_pages, 64, nkv, hd, generator=gen)
    v = torch.randn(num_pages, 64, nkv, hd, generator=gen)
    if not int8:
        return k, v, None, None
    kq, ks = quantize_kv_int8(k.reshape(-1, nkv, hd), torch.float32)
    vq, vs = quantize_kv_int8(v.reshape(-1, nkv, hd), torch.float32)
    shape = (num_pages, 64, nkv)
    return kq.view(k.shape), vq.view(v.shape), ks.view(shape), vs.view(shape)


@pytest.mark.parametrize(
    ("history", "t", "int8"), [(0, 64, False), (70, 100, False), (130, 64, True), (5, 200, False)]
)
def test_matches_reference(history: int, t: int, int8: bool) -> None:
    gen = torch.Generator().manual_seed(history + t)
    nh, nkv, hd = 6, 2, 32
    kp, vp, ks, vs = pools(9, nkv, hd, int8, gen)
    n_pages = -(-(history + t) // 64)
    order = torch.randperm(9, generator=gen)[:n_pages].to(torch.int32)  # pages out of order
    table = torch.full((1, 8), -1, dtype=torch.int32)
    table[0, :n_pages] = order
    q = torch.randn(1, t, nh, hd, generator=gen)
    lens = torch.tensor([history])
    kv_len = history + t
    assert pa.applies(q, kv_len) and not pa.applies(q, None) and not pa.applies(q[:, :63], kv_len)
    got = pa.prefill_attention(q, kp, vp, table, kv_len, 0.17, ks, vs)
    want = attention_ref.paged_attention(
        q, kp, vp, table, lens, 0.17, max_kv_len=kv_len, k_scale=ks, v_scale=vs
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_rejects_short_kv_len() -> None:
    q = torch.zeros(1, 64, 2, 8)
    kp = torch.zeros(2, 64, 1, 8)
    with pytest.raises(ValueError, match="shorter"):
        pa.prefill_attention(q, kp, kp, torch.zeros(1, 2, dtype=torch.int32), 10, 1.0)
