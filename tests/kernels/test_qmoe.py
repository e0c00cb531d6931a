"""The small-batch MoE expert kernels over quantized banks against the reference loop on the
dequantized banks (CPU interpreter; TRITON_INTERPRET=0 runs them compiled on a GPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

from ninfer.formats.weight import quantize
from ninfer.kernels import moe_ref
from ninfer.kernels.triton import moe

DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"


@pytest.mark.parametrize(
    ("fmt_in", "fmt_down"), [("q4_g64", "q5_g64"), ("q6_g64", "q8_g32"), ("fp8_e4m3_b128", "fp8_e4m3_b128")]
)
@pytest.mark.parametrize("magic", [False, True])
@pytest.mark.parametrize("n", [1, 5])
def test_quantized_experts_match_the_reference(fmt_in: str, fmt_down: str, magic: bool, n: int) -> None:
    """E 8, top-2 with a shared expert between tokens (the dedup), H 96 (a partial group), Ie 48."""
    e, h, ie, k = 8, 96, 48, 2
    g = torch.Generator().manual_seed(n + magic)
    gate_up = quantize(torch.randn(e, 2 * ie, h, generator=g) * 0.1, fmt_in).to(DEVICE)
    down = quantize(torch.randn(e, h, ie, generator=g) * 0.1, fmt_down).to(DEVICE)
    x = torch.randn(n, h, generator=g).to(DEVICE)
    idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]).to(DEVICE)
    if n > 1:
        idx[1, 0] = idx[0, 0]
    w = torch.softmax(torch.randn(n, k, generator=g), -1).to(DEVICE)
    got = moe.moe_experts_small_quantized(x, gate_up, down, idx, w, magic=magic)
    want = moe_ref.moe_experts(x.double(), gate_up, down, idx, w.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    # bf16 activations (the tensor-core tiles; bit-trick decoding's offset removed after the dot):
    # within the roundings of the projections, silu, product and weighted output to bf16
    got16 = moe.moe_experts_small_quantized(x.bfloat16(), gate_up, down, idx, w.bfloat16(), magic=magic)
    err = (got16.double() - want).abs().max() / want.abs().max()
    assert err < 3e-2
