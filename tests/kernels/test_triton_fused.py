"""Fused norm / gate / router / MoE / KV-write kernels against the torch reference (CPU interpreter)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

from ninfer.kernels import attention_ref, moe_ref, norm_ref
from ninfer.kernels.triton import gates, kv_write, moe, norms
from ninfer.model.rope import apply_rope

DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"
DTYPES = [torch.float32, torch.bfloat16]


def _r(*shape: int, seed: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """fp32: 1e-5; bf16: the two may differ by one rounding of the last stored value (1 ulp)."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(out.float(), ref.float(), rtol=1.6e-2, atol=1e-2)
        assert (out != ref).float().mean().item() < 0.02  # almost all bit-equal


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_residual_add(dtype: torch.dtype) -> None:
    x, r, w = _r(3, 5, 96, seed=1, dtype=dtype), _r(3, 5, 96, seed=2, dtype=dtype), _r(96, seed=3, scale=0.2)
    w = w.to(dtype)
    _close(norms.rms_norm(x, w, 1e-6), norm_ref.rms_norm(x, w, 1e-6), dtype)
    h, y = norms.add_rms_norm(x, r, w, 1e-6)
    h_ref, y_ref = norm_ref.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(h, h_ref)  # one rounding of an exact sum: bit-equal
    _close(y, y_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_head_norm_of_strided_query_half_and_rope(dtype: torch.dtype) -> None:
    """The query half of a fused [q | gate] projection, normed per head in place, then partial rope;
    equals the model's `apply_rope(rms_norm(q))`."""
    b, q, nh, hd, rot = 2, 3, 4, 32, 8
    qg = _r(b, q, nh, 2 * hd, seed=4, dtype=dtype)
    qh = qg[..., :hd]  # strided view, as in GatedAttention
    w = _r(hd, seed=5, scale=0.2).to(dtype)
    ang = _r(b, q, rot // 2, seed=6)
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(dtype)
    ref = apply_rope(norm_ref.rms_norm(qh, w, 1e-6), cos, sin)
    assert torch.equal(norm_ref.norm_rope(qh, w, 1e-6, cos, sin), ref)  # the reference op is the model's math
    _close(norms.norm_rope(qh, w, 1e-6, cos, sin), ref, dtype)
    _close(norms.rms_norm(qh, w, 1e-6), norm_ref.rms_norm(qh, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_norm(dtype: torch.dtype) -> None:
    x, z = _r(2, 1, 6, 24, seed=7, dtype=dtype), _r(2, 1, 6, 24, seed=8, dtype=dtype)
    w = (1 + _r(24, seed=9, scale=0.2)).to(dtype)
    _close(norms.gated_rms_norm(x, z, w, 1e-6), norm_ref.gated_rms_norm(x, z, w, 1e-6), dtype)
    w32 = w.float()  # fp32 weight on bf16 activations: the product is fp32
    _close(norms.gated_rms_norm(x, z, w32, 1e-6), norm_ref.gated_rms_norm(x, z, w32, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gates(dtype: torch.dtype) -> None:
    og = _r(2, 3, 4, 64, seed=10, dtype=dtype)
    o, gate = _r(2, 3, 4, 32, seed=11, dtype=dtype), og[..., 32:]
    _close(gates.sigmoid_gate(o, gate), norm_ref.sigmoid_gate(o, gate), dtype)
    g, u = _r(5, 1, 40, seed=12, dtype=dtype), _r(5, 1, 40, seed=13, dtype=dtype)
    _close(gates.silu_mul(g, u), norm_ref.silu_mul(g, u), dtype)
    routed, s, sg = (
        _r(5, 40, seed=14, dtype=dtype),
        _r(5, 40, seed=15, dtype=dtype),
        _r(5, 1, seed=16, dtype=dtype),
    )
    _close(gates.shared_expert_add(routed, sg, s), norm_ref.shared_expert_add(routed, sg, s), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_router(dtype: torch.dtype) -> None:
    # distinct logits per row (multiples of 1/4, exact in bf16): top-k order is defined without ties
    g = torch.Generator().manual_seed(17)
    logits = (torch.stack([torch.randperm(20, generator=g) for _ in range(7)]) * 0.25 - 2.5).to(DEVICE, dtype)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    w_ref, idx_ref = torch.topk(probs, 6, dim=-1)
    w_ref = (w_ref / w_ref.sum(-1, keepdim=True)).to(dtype)
    idx, w = moe.moe_route(logits, 6)
    assert torch.equal(idx, idx_ref)
    _close(w, w_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3])
def test_small_moe_experts(dtype: torch.dtype, n: int) -> None:
    e, h, ie, k = 6, 80, 40, 2  # widths not multiples of the blocks
    x = _r(n, h, seed=20, dtype=dtype)
    gate_up = _r(e, 2 * ie, h, seed=21, dtype=dtype, scale=h**-0.5)
    down = _r(e, h, ie, seed=22, dtype=dtype, scale=ie**-0.5)
    idx = torch.stack(
        [torch.randperm(e, generator=torch.Generator().manual_seed(23 + i))[:k] for i in range(n)]
    )
    idx = idx.to(DEVICE)
    w = torch.softmax(_r(n, k, seed=24), -1).to(dtype)
    out = moe.moe_experts_small(x, gate_up, down, idx, w, block_n=16, block_k=32)
    ref = moe_ref.moe_experts(x, gate_up, down, idx, w)
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    else:  # the reference adds experts in bf16, the kernel in fp32
        torch.testing.assert_close(
            out.float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.float().abs().max().item()
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv(dtype: torch.dtype) -> None:
    b, q, nkv, hd, page = 2, 3, 2, 32, 16
    pools = [torch.zeros(5, page, nkv, hd, dtype=dtype, device=DEVICE) for _ in range(4)]
    kvp = _r(b, q, nkv, 2 * hd, seed=30, dtype=dtype)
    k, v = kvp[..., :hd], kvp[..., hd:]  # strided views
    table = torch.tensor([[3, 1, -1], [0, 4, 2]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([14, 30], device=DEVICE)  # row 0 crosses a page boundary
    kv_write.write_kv(pools[0], pools[1], k, v, table, lens)
    attention_ref.write_kv(pools[2], pools[3], k.contiguous(), v.contiguous(), table, lens)
    assert torch.equal(pools[0], pools[2]) and torch.equal(pools[1], pools[3])
    assert pools[0].abs().sum() > 0
