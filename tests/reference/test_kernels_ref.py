"""Reference kernels: chunked vs per-token GDN, carried conv vs one-shot conv, paged vs dense attention, dispatch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ninfer.kernels import get_ops
from ninfer.kernels.attention_ref import paged_attention, write_kv
from ninfer.kernels.conv_ref import causal_conv1d_with_state
from ninfer.kernels.gdn_ref import chunk_gated_delta_rule, recurrent_gated_delta_rule
from tests.fp32_reorder import reorder_tolerance


def _gdn_inputs(b: int, t: int, nk: int, nv: int, dk: int, dv: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, nk, dk, generator=g)
    k = torch.randn(b, t, nk, dk, generator=g)
    v = torch.randn(b, t, nv, dv, generator=g)
    gate = -torch.rand(b, t, nv, generator=g) * 2.0  # log decay <= 0
    beta = torch.rand(b, t, nv, generator=g)
    h0 = torch.randn(b, nv, dk, dv, generator=g) * 0.5
    return q, k, v, gate, beta, h0


@pytest.mark.parametrize(("t", "nk", "nv"), [(1, 2, 4), (7, 2, 4), (130, 2, 6), (64, 1, 3)])
def test_chunked_matches_recurrent(t: int, nk: int, nv: int) -> None:
    q, k, v, g, beta, h0 = _gdn_inputs(2, t, nk, nv, 16, 24, seed=t)
    o_r, s_r = recurrent_gated_delta_rule(q, k, v, g, beta, h0)
    o_c, s_c = chunk_gated_delta_rule(q, k, v, g, beta, h0)
    assert (o_c - o_r).abs().max() <= 1e-5 * max(1.0, o_r.abs().max().item())
    assert (s_c - s_r).abs().max() <= 1e-5 * max(1.0, s_r.abs().max().item())
    assert s_c.dtype == torch.float32


def test_recurrent_matches_plain_math_and_splits() -> None:
    """The per-token rule written out in float64, and state carried across a split, agree."""
    q, k, v, g, beta, h0 = _gdn_inputs(1, 9, 1, 2, 8, 8, seed=3)
    o, s = recurrent_gated_delta_rule(q, k, v, g, beta, h0)
    qq = F.normalize(q.double().repeat_interleave(2, 2), dim=-1, eps=0) * 8**-0.5
    kk = F.normalize(k.double().repeat_interleave(2, 2), dim=-1, eps=0)
    state = h0.double().clone()
    for t in range(9):
        for h in range(2):
            st = state[0, h] * g[0, t, h].double().exp()
            st = st + beta[0, t, h].double() * torch.outer(
                kk[0, t, h], v[0, t, h].double() - st.T @ kk[0, t, h]
            )
            state[0, h] = st
            assert torch.allclose(o[0, t, h].double(), st.T @ qq[0, t, h], atol=1e-4)
    assert torch.allclose(s.double(), state, atol=1e-4)
    o1, s1 = chunk_gated_delta_rule(q[:, :4], k[:, :4], v[:, :4], g[:, :4], beta[:, :4], h0)
    o2, s2 = chunk_gated_delta_rule(q[:, 4:], k[:, 4:], v[:, 4:], g[:, 4:], beta[:, 4:], s1)
    assert torch.allclose(torch.cat([o1, o2], 1), o, atol=1e-5)
    assert torch.allclose(s2, s, atol=1e-5)


def test_conv_with_state_continues_one_shot_conv() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 11, 6, generator=g)
    w = torch.randn(6, 1, 4, generator=g)
    ref = F.silu(F.conv1d(x.transpose(1, 2), w, padding=3, groups=6)[..., :11]).transpose(1, 2)
    state = torch.zeros(2, 6, 3)
    outs = []
    for lo, hi in [(0, 5), (5, 6), (6, 11)]:
        y, state = causal_conv1d_with_state(x[:, lo:hi], w, state)
        outs.append(y)
    assert torch.allclose(torch.cat(outs, 1), ref, atol=1e-6)
    assert torch.equal(state, x[:, -3:].transpose(1, 2))


def test_paged_attention_matches_dense_causal() -> None:
    g = torch.Generator().manual_seed(0)
    nh, nkv, hd, page = 4, 2, 16, 64
    lens, q_len = [70, 3], 5
    k_pool = torch.zeros(10, page, nkv, hd)
    v_pool = torch.zeros(10, page, nkv, hd)
    table = torch.tensor([[7, 2], [4, -1]], dtype=torch.int32)
    cache_lens = torch.tensor(lens)
    full_k = [torch.randn(n + q_len, nkv, hd, generator=g) for n in lens]
    full_v = [torch.randn(n + q_len, nkv, hd, generator=g) for n in lens]
    for b, n in enumerate(lens):  # history, written one token at a time
        for p in range(n):
            write_kv(
                k_pool,
                v_pool,
                full_k[b][p][None, None],
                full_v[b][p][None, None],
                table[b : b + 1],
                torch.tensor([p]),
            )
    k_new = torch.stack([fk[-q_len:] for fk in full_k])
    v_new = torch.stack([fv[-q_len:] for fv in full_v])
    write_kv(k_pool, v_pool, k_new, v_new, table, cache_lens)
    q = torch.randn(2, q_len, nh, hd, generator=g)
    o = paged_attention(q, k_pool, v_pool, table, cache_lens, hd**-0.5)
    for b, n in enumerate(lens):
        kk = full_k[b].repeat_interleave(nh // nkv, 1).transpose(0, 1)  # [nh, L, hd]
        vv = full_v[b].repeat_interleave(nh // nkv, 1).transpose(0, 1)
        s = q[b].transpose(0, 1) @ kk.transpose(1, 2) * hd**-0.5  # [nh, q, L]
        allowed = torch.arange(n + q_len)[None] <= (n + torch.arange(q_len))[:, None]
        ref = (s.masked_fill(~allowed, float("-inf")).softmax(-1) @ vv).transpose(0, 1)
        # paged and dense attention sum the same n + q_len keys in another order
        assert torch.allclose(o[b], ref, **reorder_tolerance(ref, max(n + q_len, hd)))


def test_dispatch_lists_valid_names() -> None:
    assert get_ops("cpu").name == "reference"
    assert get_ops("cuda", "reference").name == "reference"
    with pytest.raises(ValueError, match=r"valid backends.*reference"):
        get_ops("cpu", "nope")
    with pytest.raises(ValueError, match="does not run on device type"):
        get_ops("mps", "reference")
