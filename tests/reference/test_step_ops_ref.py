"""Reference slot-pool step ops (GDN, conv), sync-free MoE variants and int8 KV vs the plain reference ops."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels.attention_ref import paged_attention, write_kv
from ninfer.kernels.conv_ref import causal_conv1d_with_state, conv_step
from ninfer.kernels.gdn_ref import gdn_gates, gdn_step, recurrent_gated_delta_rule
from ninfer.kernels.kv_quant import dequantize_kv_int8, quantize_kv_int8
from ninfer.kernels.moe_grouped import moe_experts_gathered, moe_experts_grouped
from ninfer.kernels.moe_ref import moe_experts


def _gdn_inputs(n: int, t: int, nk: int, nv: int, dk: int, dv: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(n, t, nk, dk, generator=g), torch.randn(n, t, nk, dk, generator=g)
    v = torch.randn(n, t, nv, dv, generator=g)
    a, b = torch.randn(n, t, nv, generator=g) * 2, torch.randn(n, t, nv, generator=g) * 2
    a_log = torch.rand(nv, generator=g) * 2 - 1
    dt_bias = torch.randn(nv, generator=g)
    return q, k, v, a, b, a_log, dt_bias


@pytest.mark.parametrize(("n", "t", "nk", "nv"), [(3, 1, 2, 4), (2, 5, 1, 3)])
def test_gdn_step_writes_the_state_after_every_token(n: int, t: int, nk: int, nv: int) -> None:
    dk, dv = 8, 12
    q, k, v, a, b, a_log, dt_bias = _gdn_inputs(n, t, nk, nv, dk, dv, seed=t)
    slots = n * t + 2
    pool = torch.randn(slots, nv, dk, dv, generator=torch.Generator().manual_seed(1))
    before = pool.clone()
    perm = torch.randperm(slots, generator=torch.Generator().manual_seed(2))
    writes = perm[: n * t].reshape(n, t)
    start = torch.cat([writes[:1, 0], perm[n * t : n * t + n - 1]])  # row 0 overwrites its start slot
    o = gdn_step(q, k, v, a, b, a_log, dt_bias, pool, writes, start)
    g, beta = gdn_gates(a, b, a_log, dt_bias)
    for i in range(n):
        s = before[start[i]][None]
        for j in range(t):  # the per-token rule, one token at a time
            sl = slice(j, j + 1)
            o_j, s = recurrent_gated_delta_rule(q[i : i + 1, sl], k[i : i + 1, sl], v[i : i + 1, sl],
                                                g[i : i + 1, sl], beta[i : i + 1, sl], s)  # fmt: skip
            assert torch.allclose(o[i, j], o_j[0, 0], atol=1e-5)
            assert torch.allclose(pool[writes[i, j]], s[0], atol=1e-5)
    untouched = sorted(set(range(slots)) - set(writes.flatten().tolist()))
    assert torch.equal(pool[untouched], before[untouched])


def test_gdn_step_padding_rows_and_unstored_tokens() -> None:
    q, k, v, a, b, a_log, dt_bias = _gdn_inputs(3, 2, 1, 2, 8, 8, seed=7)
    pool = torch.randn(4, 2, 8, 8)
    pool[0] = float("nan")  # a padding row must not even read slot 0 (its clamped index)
    before = pool.clone()
    writes = torch.tensor([[-1, 2], [-1, 0], [-1, 3]])
    start = torch.tensor([1, -1, 3])
    o = gdn_step(q, k, v, a, b, a_log, dt_bias, pool, writes, start)
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    assert pool[0].isnan().all()  # never written, and the padding row's output is finite zeros
    g, beta = gdn_gates(a, b, a_log, dt_bias)
    for row, src, dst in ((0, 1, 2), (2, 3, 3)):
        sl = slice(row, row + 1)
        o_ref, s_ref = recurrent_gated_delta_rule(q[sl], k[sl], v[sl], g[sl], beta[sl], before[src][None])
        assert torch.allclose(o[row], o_ref[0], atol=1e-5)
        assert torch.allclose(pool[dst], s_ref[0], atol=1e-5)
    assert torch.equal(pool[1], before[1])


def test_conv_step_matches_carried_conv_per_token() -> None:
    gen = torch.Generator().manual_seed(0)
    n, t, c, kern = 3, 4, 6, 4
    x = torch.randn(n, t, c, generator=gen)
    w = torch.randn(c, 1, kern, generator=gen)
    pool = torch.randn(9, c, kern - 1, generator=gen)
    before = pool.clone()
    writes = torch.tensor([[0, 1, 2, 3], [4, -1, -1, 5], [-1, -1, -1, -1]])
    start = torch.tensor([0, 6, -1])  # row 0 overwrites its start slot first
    y = conv_step(x, w, pool, writes, start)
    for i in range(n):
        state = before[start[i]][None] if start[i] >= 0 else torch.zeros(1, c, kern - 1)
        for j in range(t):
            y_j, state = causal_conv1d_with_state(x[i : i + 1, j : j + 1], w, state)
            if start[i] < 0:
                assert torch.equal(y[i, j], torch.zeros(c))
                continue
            assert torch.allclose(y[i, j], y_j[0, 0], atol=1e-6)
            if writes[i, j] >= 0:
                assert torch.equal(pool[writes[i, j]], state[0])
    for s in (6, 7, 8):
        assert torch.equal(pool[s], before[s])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 5, 40])
def test_sync_free_moe_variants_match_reference(dtype: torch.dtype, n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    e, h, ie, k = 8, 32, 16, 3
    x = torch.randn(n, h, generator=gen).to(dtype)
    gate_up = (torch.randn(e, 2 * ie, h, generator=gen) / h**0.5).to(dtype)
    down = (torch.randn(e, h, ie, generator=gen) / ie**0.5).to(dtype)
    probs = torch.randn(n, e, generator=gen).softmax(-1)
    w, idx = probs.topk(k, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(dtype)
    ref = moe_experts(x, gate_up, down, idx, w).float()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for fn in (moe_experts_grouped, moe_experts_gathered):
        out = fn(x, gate_up, down, idx, w)
        assert out.dtype == dtype and out.shape == x.shape
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        assert err <= tol, (fn.__name__, err)


def test_int8_kv_roundtrip_and_attention_close_to_float() -> None:
    gen = torch.Generator().manual_seed(0)
    nh, nkv, hd, page, pages = 4, 2, 32, 64, 6
    table = torch.tensor([[3, 0, 5], [1, 4, -1]], dtype=torch.int32)
    k_all = torch.randn(2, 140, nkv, hd, generator=gen)
    v_all = torch.randn(2, 140, nkv, hd, generator=gen)
    f_k, f_v = torch.zeros(pages, page, nkv, hd), torch.zeros(pages, page, nkv, hd)
    q_k, q_v = (torch.zeros(pages, page, nkv, hd, dtype=torch.int8) for _ in range(2))
    ks, vs = torch.zeros(pages, page, nkv), torch.zeros(pages, page, nkv)
    zero = torch.zeros(2, dtype=torch.int64)
    write_kv(f_k, f_v, k_all[:, :60], v_all[:, :60], table, zero)
    write_kv(q_k, q_v, k_all[:, :60], v_all[:, :60], table, zero, ks, vs)
    hist = torch.tensor([60, 0])
    write_kv(f_k, f_v, k_all[:1, 60:130], v_all[:1, 60:130], table[:1], hist[:1])
    write_kv(q_k, q_v, k_all[:1, 60:130], v_all[:1, 60:130], table[:1], hist[:1], ks, vs)
    xq, sc = quantize_kv_int8(k_all)
    assert ((dequantize_kv_int8(xq, sc, torch.float32) - k_all).abs() <= sc[..., None] / 2 + 1e-7).all()
    q = torch.randn(2, 4, nh, hd, generator=gen)
    ctx = torch.tensor([126, 56])  # 4 new tokens already written after these
    ref = paged_attention(q, f_k, f_v, table, ctx, hd**-0.5)
    out = paged_attention(q, q_k, q_v, table, ctx, hd**-0.5, k_scale=ks, v_scale=vs)
    assert (out - ref).abs().max() < 2e-2
    assert (out - ref).norm() / ref.norm() < 1e-2
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        paged_attention(q, q_k, q_v, table, ctx, hd**-0.5)
