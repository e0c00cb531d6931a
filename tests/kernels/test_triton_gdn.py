"""Triton GDN decode/verify kernel vs a float64 recurrence (CPU interpreter; CUDA with TRITON_INTERPRET=0)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

from triton_refs import gdn_gates, gdn_recurrence

from ninfer.kernels import gdn_ref
from ninfer.kernels.triton import gdn_decode_step, recurrent_gated_delta_rule

DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"


def _inputs(n, t, nk, nv, dk, dv, dtype, seed):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen) * s).to(dtype).to(DEVICE)

    q, k = rnd(n, t, nk, dk), rnd(n, t, nk, dk)
    v = rnd(n, t, nv, dv)
    a, b = rnd(n, t, nv, s=2.0), rnd(n, t, nv, s=2.0)
    a_log = (torch.rand(nv, generator=gen) * 2 - 1).to(DEVICE)  # fp32
    dt_bias = torch.randn(nv, generator=gen).to(DEVICE)
    return q, k, v, a, b, a_log, dt_bias


def _pool(num_slots, nv, dk, dv, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(num_slots, nv, dk, dv, generator=gen) * 0.5).to(DEVICE)


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    ("n", "t", "nk", "nv", "dk", "dv", "dtype"),
    [
        (3, 1, 2, 4, 16, 16, torch.float32),  # plain decode, GQA r=2
        (2, 4, 1, 3, 32, 24, torch.float32),  # verify T=k+1, r=3, dv not a multiple of the block
        (2, 1, 2, 2, 20, 16, torch.float32),  # dk not a power of two
        (3, 3, 2, 4, 16, 16, torch.bfloat16),
    ],
)
def test_gdn_step_matches_recurrence(n, t, nk, nv, dk, dv, dtype):
    q, k, v, a, b, a_log, dt_bias = _inputs(n, t, nk, nv, dk, dv, dtype, seed=n * 100 + t)
    num_slots = n * t + 3
    pool = _pool(num_slots, nv, dk, dv, seed=7)
    before = pool.clone()
    perm = torch.randperm(num_slots, generator=torch.Generator().manual_seed(3))
    slot_idx = perm[: n * t].reshape(n, t).to(torch.int32).to(DEVICE)  # distinct write slots
    start = perm[-n:].flip(0).to(torch.int64).to(DEVICE)  # read slots, disjoint from the writes
    out = torch.full((n, t, nv, dv), float("nan"), dtype=dtype, device=DEVICE)

    o = gdn_decode_step(q, k, v, a, b, a_log, dt_bias, pool, slot_idx, start, out=out)

    assert o.data_ptr() == out.data_ptr() and o.dtype == dtype
    g, beta = gdn_gates(a.cpu(), b.cpu(), a_log.cpu(), dt_bias.cpu())
    written = set(slot_idx.flatten().tolist())
    for i in range(n):
        ref_o, ref_states = gdn_recurrence(
            q[i].cpu(), k[i].cpu(), v[i].cpu(), g[i], beta[i], before[start[i]].cpu()
        )
        torch.testing.assert_close(o[i].cpu().double(), ref_o, **_tol(dtype))
        for j in range(t):  # the state after token j sits in slot_idx[i, j]
            torch.testing.assert_close(pool[slot_idx[i, j]].cpu().double(), ref_states[j], **_tol(dtype))
    untouched = [s for s in range(num_slots) if s not in written]
    assert torch.equal(pool[untouched], before[untouched])


def test_gdn_step_in_place_same_slot_and_padding_rows():
    """Decode reads and overwrites one slot; rows with slot -1 touch nothing and give zeros."""
    n, t, nk, nv, dk, dv = 4, 1, 1, 2, 16, 16
    q, k, v, a, b, a_log, dt_bias = _inputs(n, t, nk, nv, dk, dv, torch.float32, seed=11)
    pool = _pool(6, nv, dk, dv, seed=12)
    before = pool.clone()
    slots = torch.tensor([4, -1, 1, -1], device=DEVICE)
    out = torch.full((n, t, nv, dv), float("nan"), device=DEVICE)

    gdn_decode_step(q, k, v, a, b, a_log, dt_bias, pool, slots[:, None], out=out)

    g, beta = gdn_gates(a.cpu(), b.cpu(), a_log.cpu(), dt_bias.cpu())
    for i, s in enumerate(slots.tolist()):
        if s < 0:
            assert torch.equal(out[i].cpu(), torch.zeros(t, nv, dv))
            continue
        ref_o, ref_states = gdn_recurrence(q[i].cpu(), k[i].cpu(), v[i].cpu(), g[i], beta[i], before[s].cpu())
        torch.testing.assert_close(out[i].cpu().double(), ref_o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool[s].cpu().double(), ref_states[-1], rtol=1e-5, atol=1e-5)
    for s in (0, 2, 3, 5):
        assert torch.equal(pool[s], before[s])


def test_gdn_verify_then_continue_from_accepted_slot():
    """vLLM slot scheme: verify k+1 tokens into k+1 slots, then continue from slot num_accepted-1."""
    n, t, nk, nv, dk, dv = 2, 4, 1, 2, 16, 16
    q, k, v, a, b, a_log, dt_bias = _inputs(n, t + 1, nk, nv, dk, dv, torch.float32, seed=21)
    pool = _pool(2 * t, nv, dk, dv, seed=22)
    before = pool.clone()
    slot_idx = torch.arange(2 * t, device=DEVICE).reshape(n, t)  # each sequence owns t slots
    start = slot_idx[:, 0].clone()
    gdn_decode_step(q[:, :t], k[:, :t], v[:, :t], a[:, :t], b[:, :t], a_log, dt_bias, pool, slot_idx, start)

    accepted = torch.tensor([2, 4], device=DEVICE)  # num_accepted per sequence
    next_start = slot_idx.gather(1, (accepted - 1)[:, None])[:, 0]
    last = slice(t, t + 1)
    o = gdn_decode_step(
        q[:, last],
        k[:, last],
        v[:, last],
        a[:, last],
        b[:, last],
        a_log,
        dt_bias,
        pool,
        slot_idx[:, :1],
        next_start,
    )

    g, beta = gdn_gates(a.cpu(), b.cpu(), a_log.cpu(), dt_bias.cpu())
    for i in range(n):
        m = int(accepted[i])
        keep = [*range(m), t]  # the accepted tokens, then the next token
        ref_o, ref_states = gdn_recurrence(
            q[i, keep].cpu(),
            k[i, keep].cpu(),
            v[i, keep].cpu(),
            g[i, keep],
            beta[i, keep],
            before[start[i]].cpu(),
        )
        torch.testing.assert_close(o[i, 0].cpu().double(), ref_o[-1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool[slot_idx[i, 0]].cpu().double(), ref_states[-1], rtol=1e-5, atol=1e-5)


def test_recurrent_adapter_matches_reference_op():
    n, t, nk, nv, dk, dv = 2, 3, 2, 4, 16, 32
    q, k, v, a, b, a_log, dt_bias = _inputs(n, t, nk, nv, dk, dv, torch.float32, seed=31)
    g, beta = (x.float().to(DEVICE) for x in gdn_gates(a.cpu(), b.cpu(), a_log.cpu(), dt_bias.cpu()))
    h0 = _pool(n, nv, dk, dv, seed=32)
    h0_copy = h0.clone()

    o, state = recurrent_gated_delta_rule(q, k, v, g, beta, h0)
    ref_o, ref_state = gdn_ref.recurrent_gated_delta_rule(q, k, v, g, beta, h0)

    assert torch.equal(h0, h0_copy)  # the initial state is not modified
    torch.testing.assert_close(o, ref_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, ref_state, rtol=1e-5, atol=1e-5)
    o0, s0 = recurrent_gated_delta_rule(q, k, v, g, beta, None)
    r0, rs0 = gdn_ref.recurrent_gated_delta_rule(q, k, v, g, beta, None)
    torch.testing.assert_close(o0, r0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s0, rs0, rtol=1e-5, atol=1e-5)


def test_strided_views_from_a_fused_projection():
    """q, k, v as views into one conv output (what the model passes) give the same result."""
    n, t, nk, nv, dk, dv = 2, 2, 2, 4, 16, 16
    q, k, v, a, b, a_log, dt_bias = _inputs(n, t, nk, nv, dk, dv, torch.float32, seed=41)
    fused = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], dim=-1)  # [N, T, conv_dim]
    kd = nk * dk
    qv, kv, vv = (
        fused[..., :kd].view(n, t, nk, dk),
        fused[..., kd : 2 * kd].view(n, t, nk, dk),
        fused[..., 2 * kd :].view(n, t, nv, dv),
    )
    pool = _pool(2, nv, dk, dv, seed=42)
    pool2 = pool.clone()
    slots = torch.tensor([[1, -1], [0, -1]], dtype=torch.int32, device=DEVICE)
    start = torch.tensor([1, 0], device=DEVICE)
    o1 = gdn_decode_step(qv, kv, vv, a, b, a_log, dt_bias, pool, slots, start)
    o2 = gdn_decode_step(q, k, v, a, b, a_log, dt_bias, pool2, slots, start)
    assert torch.equal(o1, o2) and torch.equal(pool, pool2)


def test_rejects_bad_shapes():
    q, k, v, a, b, a_log, dt_bias = _inputs(2, 1, 2, 3, 16, 16, torch.float32, seed=51)
    pool = _pool(2, 3, 16, 16, seed=52)
    slots = torch.zeros(2, 1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="multiple of key heads"):
        gdn_decode_step(q, k, v, a, b, a_log, dt_bias, pool, slots)
    with pytest.raises(TypeError, match="int32 or int64"):
        gdn_decode_step(
            q, k, v[:, :, :2], a[..., :2], b[..., :2], a_log[:2], dt_bias[:2], pool[:, :2], slots.float()
        )


def test_prefill_bucket_pattern_keeps_only_the_last_real_state():
    """A short prompt padded to a 32-token bucket (the prefill graphs): the state after the last
    real token lands in the live slot, read from that same slot; padding states are not stored."""
    n, t, real, nk, nv, dk, dv = 1, 32, 21, 1, 2, 16, 16
    q, k, v, a, b, a_log, dt_bias = _inputs(n, t, nk, nv, dk, dv, torch.float32, seed=21)
    pool = _pool(4, nv, dk, dv, seed=22)
    before = pool.clone()
    live = 2
    slot_idx = torch.full((n, t), -1, dtype=torch.int32, device=DEVICE)
    slot_idx[0, real - 1] = live
    out = torch.full((n, t, nv, dv), float("nan"), device=DEVICE)
    gdn_decode_step(
        q, k, v, a, b, a_log, dt_bias, pool, slot_idx, torch.tensor([live], device=DEVICE), out=out
    )
    g, beta = gdn_gates(a.cpu(), b.cpu(), a_log.cpu(), dt_bias.cpu())
    ref_o, ref_states = gdn_recurrence(q[0].cpu(), k[0].cpu(), v[0].cpu(), g[0], beta[0], before[live].cpu())
    torch.testing.assert_close(out[0, :real].cpu().double(), ref_o[:real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool[live].cpu().double(), ref_states[real - 1], rtol=1e-5, atol=1e-5)
    for s in (0, 1, 3):
        assert torch.equal(pool[s], before[s])
