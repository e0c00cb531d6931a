"""Triton conv step with per-token window writes vs the torch reference op (CPU interpreter; CUDA with TRITON_INTERPRET=0)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

from ninfer.kernels import conv_ref
from ninfer.kernels.triton.conv_step import conv_step

DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"


def _rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


@pytest.mark.parametrize(
    ("n", "t", "c", "width", "dtype"),
    [
        (3, 1, 40, 4, torch.float32),  # decode; C not a multiple of the block
        (2, 5, 24, 4, torch.float32),  # verify, T > K
        (2, 2, 16, 2, torch.float32),  # K = 2 (window of one column)
        (3, 3, 32, 4, torch.bfloat16),
        (2, 2, 16, 4, torch.float32),  # T < K - 1: the window carries over in part
        (2, 64, 24, 4, torch.bfloat16),  # a prefill bucket: the looped tokens past the window
    ],
)
def test_conv_step_matches_reference(n, t, c, width, dtype):
    num_slots = n * t + n + 1
    x = _rand(n, t, c, dtype=dtype, seed=1)
    w = _rand(c, 1, width, dtype=dtype, seed=2)
    pool = _rand(num_slots, c, width - 1, dtype=dtype, seed=3)
    perm = torch.randperm(num_slots, generator=torch.Generator().manual_seed(4))
    writes = perm[: n * t].reshape(n, t).to(DEVICE)
    writes[0, 1 % t] = -1 if t > 1 else writes[0, 0]  # a token whose state is not kept
    start = perm[n * t : n * t + n].to(torch.int32).to(DEVICE)
    start[0] = writes[0, -1]  # row 0 overwrites its own start slot
    ref_pool = pool.clone()
    y_ref = conv_ref.conv_step(x, w, ref_pool, writes, start)
    y = conv_step(x, w, pool, writes, start)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y.float(), y_ref.float(), **tol)
    torch.testing.assert_close(pool.float(), ref_pool.float(), rtol=0, atol=0)  # windows are copies


def test_conv_step_padding_rows_touch_nothing():
    n, t, c, width = 3, 2, 16, 4
    x = _rand(n, t, c, seed=5)
    w = _rand(c, width, seed=6)
    pool = _rand(5, c, width - 1, seed=7)
    pool[0] = float("nan")
    before = pool.clone()
    writes = torch.tensor([[1, 2], [-1, 0], [3, 4]], device=DEVICE)
    start = torch.tensor([1, -1, 4], device=DEVICE)
    ref_pool = pool.clone()
    y_ref = conv_ref.conv_step(x, w, ref_pool, writes, start)
    y = conv_step(x, w, pool, writes, start)
    assert torch.equal(y[1], torch.zeros_like(y[1]))
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    assert pool[0].isnan().all() and torch.equal(pool[1:], ref_pool[1:])
    assert not torch.equal(pool[4], before[4])


def test_conv_step_rejects_a_wide_window():
    x = _rand(1, 1, 8, seed=8)
    with pytest.raises(ValueError, match="conv_pool must be"):
        conv_step(x, _rand(8, 4, seed=9), _rand(2, 8, 5, seed=10), torch.zeros(1, 1, dtype=torch.int64),
                  torch.zeros(1, dtype=torch.int64))  # fmt: skip


def test_conv_step_prefill_bucket_pattern():
    """32 tokens (the largest prefill bucket, the kernel's unrolled maximum), the window kept only
    after the last real token, in the slot it was read from."""
    t, real, c, width = 32, 21, 24, 4
    x = _rand(1, t, c, seed=8)
    w = _rand(c, 1, width, seed=9)
    pool = _rand(3, c, width - 1, seed=10)
    writes = torch.full((1, t), -1, device=DEVICE)
    writes[0, real - 1] = 1
    start = torch.tensor([1], device=DEVICE)
    ref_pool = pool.clone()
    y_ref = conv_ref.conv_step(x, w, ref_pool, writes, start)
    y = conv_step(x, w, pool, writes, start)
    torch.testing.assert_close(y[:, :real], y_ref[:, :real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool, ref_pool, rtol=0, atol=0)
