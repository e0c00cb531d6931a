"""Triton slot-indexed causal conv1d update vs a float64 reference (CPU interpreter; CUDA with TRITON_INTERPRET=0)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

from triton_refs import causal_conv_window

from ninfer.kernels import conv_ref
from ninfer.kernels.triton import causal_conv1d_update, causal_conv1d_with_state

DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"


def _rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    ("n", "t", "c", "width", "dtype"),
    [
        (3, 1, 40, 4, torch.float32),  # decode; C not a multiple of the block
        (2, 3, 24, 4, torch.float32),  # T > 1
        (2, 1, 16, 2, torch.float32),  # K = 2 (window of one column)
        (3, 2, 32, 4, torch.bfloat16),
    ],
)
def test_conv_update_matches_reference(n, t, c, width, dtype):
    num_slots = n + 3
    x = _rand(n, t, c, dtype=dtype, seed=1)
    w = _rand(c, 1, width, dtype=dtype, seed=2)
    pool = _rand(num_slots, c, width - 1, dtype=dtype, seed=3)
    before = pool.clone()
    perm = torch.randperm(num_slots, generator=torch.Generator().manual_seed(4))
    slot = perm[:n].to(DEVICE)
    out = torch.full((n, t, c), float("nan"), dtype=dtype, device=DEVICE)

    y = causal_conv1d_update(x, w, pool, slot, out=out, block_c=16)

    assert y.data_ptr() == out.data_ptr()
    for i in range(n):
        ref_y, ref_state = causal_conv_window(x[i].cpu(), w[:, 0].cpu(), before[slot[i]].cpu(), 0)
        torch.testing.assert_close(y[i].cpu().double(), ref_y, **_tol(dtype))
        assert torch.equal(pool[slot[i]].cpu().double(), ref_state)  # raw inputs, stored exactly
    others = perm[n:].to(DEVICE)
    assert torch.equal(pool[others], before[others])


def test_padding_rows_untouched():
    n, c = 3, 16
    x = _rand(n, 1, c, seed=5)
    w = _rand(c, 4, seed=6)
    pool = _rand(4, c, 3, seed=7)
    before = pool.clone()
    slot = torch.tensor([-1, 2, -1], device=DEVICE)
    y = causal_conv1d_update(x, w, pool, slot)
    assert torch.equal(y[0], torch.zeros(1, c, device=DEVICE)) and torch.equal(y[2], y[0])
    ref_y, ref_state = causal_conv_window(x[1].cpu(), w.cpu(), before[2].cpu(), 0)
    torch.testing.assert_close(y[1].cpu().double(), ref_y, rtol=1e-5, atol=1e-5)
    assert torch.equal(pool[2].cpu().double(), ref_state)
    for s in (0, 1, 3):
        assert torch.equal(pool[s], before[s])


def test_speculative_window_continues_from_accepted_inputs():
    """State of K-1+k columns: verify k+1 inputs, then continue with offset num_accepted-1."""
    k_spec, width, c, n = 3, 4, 16, 3
    s = width - 1 + k_spec
    x = _rand(n, k_spec + 1, c, seed=8)
    x_next = _rand(n, k_spec + 1, c, seed=9)
    w = _rand(c, width, seed=10)
    pool = _rand(n + 1, c, s, seed=11)
    before = pool.clone()
    slot = torch.tensor([3, 0, 1], device=DEVICE)
    first = torch.tensor([1, 3, 4], device=DEVICE)  # num_accepted of the previous step
    second = torch.tensor([4, 1, 2], device=DEVICE)

    y1 = causal_conv1d_update(x, w, pool, slot, first)
    mid = pool.clone()
    y2 = causal_conv1d_update(x_next, w, pool, slot, second)

    for i in range(n):
        st = before[slot[i]].cpu()
        ref1, ref_state1 = causal_conv_window(x[i].cpu(), w.cpu(), st, int(first[i]) - 1)
        torch.testing.assert_close(y1[i].cpu().double(), ref1, rtol=1e-5, atol=1e-5)
        assert torch.equal(mid[slot[i]].cpu().double(), ref_state1)
        ref2, ref_state2 = causal_conv_window(x_next[i].cpu(), w.cpu(), ref_state1, int(second[i]) - 1)
        torch.testing.assert_close(y2[i].cpu().double(), ref2, rtol=1e-5, atol=1e-5)
        assert torch.equal(pool[slot[i]].cpu().double(), ref_state2)
        # the accepted prefix equals a plain run over history + accepted inputs
        m = int(second[i])
        hist = torch.cat(
            [before[slot[i]].cpu().double()[:, : int(first[i]) - 1 + width - 1], x[i].cpu().double().T], 1
        )
        hist = hist[:, : int(first[i]) - 1 + width - 1 + m]  # drop the rejected inputs of step 1
        plain, _ = causal_conv_window(x_next[i].cpu(), w.cpu(), hist[:, -(width - 1) :], 0)
        torch.testing.assert_close(y2[i].cpu().double(), plain, rtol=1e-5, atol=1e-5)
    assert torch.equal(pool[2], before[2])


def test_with_state_adapter_matches_reference_op():
    x = _rand(2, 5, 24, seed=12)
    w = _rand(24, 1, 4, seed=13)
    st = _rand(2, 24, 3, seed=14)
    st_copy = st.clone()
    y, new = causal_conv1d_with_state(x, w, st)
    ref_y, ref_new = conv_ref.causal_conv1d_with_state(x, w, st)
    assert torch.equal(st, st_copy)
    torch.testing.assert_close(y, ref_y, rtol=1e-5, atol=1e-5)
    assert torch.equal(new, ref_new)


def test_rejects_short_verify_for_wide_window():
    pool = _rand(2, 16, 6, seed=15)
    with pytest.raises(ValueError, match="needs T >= 3"):
        causal_conv1d_update(
            _rand(1, 2, 16, seed=16), _rand(16, 4, seed=17), pool, torch.tensor([0], device=DEVICE),
            torch.tensor([1], device=DEVICE),
        )  # fmt: skip
