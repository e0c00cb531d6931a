"""Fused gated products (Triton): attention output gate, SwiGLU activation, shared-expert add.

Each is one launch instead of torch's two or three (plus the copy of a strided gate view);
roundings follow `ninfer.kernels.norm_ref`: every intermediate torch stores in the activation
dtype is rounded to it here too, so the kernel compiles without FMA contraction (which fused the
shared-expert add's rounded product into an FMA on the H200: 22 % of bf16 outputs 1 ulp off).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton import pdl
from ninfer.kernels.triton._checks import check_devices
from ninfer.kernels.triton.pdl import pdl_enter

_BLOCK = 1024


@triton.jit
def _gate_kernel(
    a_ptr, b_ptr, g_ptr, y_ptr,  # [rows, INNER, D] each (g: [rows] for OP 2)
    INNER, D,
    sa0, sa1, sb0, sb1, sg0, sy0, sy1,
    OP: tl.constexpr,  # 0: a * sigmoid(b); 1: silu(a) * b; 2: a + sigmoid(g[row]) * b
    BD: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    o, i = row // INNER, row % INNER
    offs = tl.program_id(1) * BD + tl.arange(0, BD)
    mask = offs < D
    dt = y_ptr.dtype.element_ty
    a = tl.load(a_ptr + o * sa0 + i * sa1 + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + o * sb0 + i * sb1 + offs, mask=mask, other=0.0).to(tl.float32)
    if OP == 0:
        y = a * tl.sigmoid(b).to(dt).to(tl.float32)
    elif OP == 1:
        y = (a * tl.sigmoid(a)).to(dt).to(tl.float32) * b
    else:
        g = tl.sigmoid(tl.load(g_ptr + o * sg0).to(tl.float32)).to(dt).to(tl.float32)
        y = a + (g * b).to(dt).to(tl.float32)
    tl.store(y_ptr + o * sy0 + i * sy1 + offs, y.to(dt), mask=mask)


def _view3(x: torch.Tensor, inner: int, name: str) -> torch.Tensor:
    if x.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim (stride {x.stride()})")
    try:
        return x.view(-1, inner, x.shape[-1])
    except RuntimeError as err:
        raise ValueError(f"{name} {tuple(x.shape)} / {x.stride()}: leading dims must merge into one") from err


def _launch(a: torch.Tensor, b: torch.Tensor, g: torch.Tensor | None, out_shape: tuple[int, ...], op: int):
    """a, b: [..., inner, D] or [..., D] views of one shape; the output is contiguous `out_shape`."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"operands {tuple(a.shape)} {a.dtype} / {tuple(b.shape)} {b.dtype} must match")
    check_devices(a, b, *(() if g is None else (g,)))
    inner = a.shape[-2] if a.dim() >= 3 else 1
    av, bv = _view3(a, inner, "a"), _view3(b, inner, "b")
    y = torch.empty(out_shape, dtype=a.dtype, device=a.device)
    yv = y.view(av.shape)
    rows, d = av.shape[0] * inner, av.shape[2]
    gs = 0 if g is None else g.stride(0)
    if rows and d:
        bd = min(_BLOCK, triton.next_power_of_2(d))
        _gate_kernel[(rows, triton.cdiv(d, bd))](
            av, bv, av if g is None else g, yv, inner, d,
            av.stride(0), av.stride(1), bv.stride(0), bv.stride(1), gs, yv.stride(0), yv.stride(1),
            OP=op, BD=bd, num_warps=4, enable_fp_fusion=False, **pdl.launch(a),
        )  # fmt: skip
    return y


def sigmoid_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`norm_ref.sigmoid_gate`: o [B, q, nh, hd] * sigmoid(gate [B, q, nh, hd] view) -> [B, q, nh*hd]."""
    b, q = o.shape[:2]
    return _launch(o, gate, None, (b, q, o[0, 0].numel() if b * q else 0), 0)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`norm_ref.silu_mul`: silu(gate) * up, [..., D] -> contiguous [..., D]."""
    return _launch(gate, up, None, tuple(gate.shape), 1)


def shared_expert_add(routed: torch.Tensor, gate_logit: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """`norm_ref.shared_expert_add`: routed [N, H] + sigmoid(gate_logit [N, 1]) * shared [N, H]."""
    n = routed.shape[0]
    if routed.dim() != 2 or gate_logit.shape != (n, 1):
        raise ValueError(
            f"routed must be [N, H] and gate_logit [N, 1]; got {routed.shape}, {gate_logit.shape}"
        )
    return _launch(routed, shared, gate_logit, tuple(routed.shape), 2)
