"""Dequantization into a reused buffer (Triton), for the calls with many rows (prefill chunks): the
weight's codes and scales decoded to the activation dtype, then one dense GEMM (cuBLAS / grouped mm).

Every launch writes into one scratch buffer per (device, dtype), sized before capture to the largest
quantized weight the model holds (`reserve`); a call finds it there, so captured prefill graphs never
allocate. The values are fp32(scale) * code rounded once to the dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.formats import QuantWeight
from ninfer.kernels.triton.qdecode import decode_group
from ninfer.kernels.triton.qgemv import high_words

_FMT_IDS = {"q4_g64": 0, "q5_g64": 1, "q6_g64": 2, "q8_g32": 3, "fp8_e4m3_b128": 4}
BLOCK_ROWS = 32
GROUPS_PER_PROGRAM = 4
_SCRATCH: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


@triton.jit
def _dequant_kernel(
    base_ptr, high_ptr, scale_ptr, out_ptr,  # planes of R rows; out [R, K]
    R, K, N_PER, GROUPS, sb, sh, ss, so,
    FMT: tl.constexpr,
    BLOCK: tl.constexpr,
    GPP: tl.constexpr,  # groups per program
):  # fmt: skip
    """Program (row block, group block): BLOCK rows' lanes of GPP scale groups, written as out's dtype."""
    G: tl.constexpr = 64 if FMT < 3 else (32 if FMT == 3 else 128)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rowc = tl.minimum(rows, R - 1).to(tl.int64)
    if FMT == 4:  # each expert's own 128-row blocks (N_PER rows an expert; R for a matrix)
        srow = (rowc // N_PER) * ((N_PER + 127) // 128) + (rowc % N_PER) // 128
    else:
        srow = rowc
    dt = out_ptr.dtype.element_ty
    live = rows[:, None] < R
    for i in tl.static_range(GPP):
        g = tl.program_id(1) * GPP + i
        gc = tl.minimum(g, GROUPS - 1)
        w, s = decode_group(base_ptr, high_ptr, scale_ptr, rowc, srow, gc, K, sb, sh, ss, FMT, False, False, tl.float32)
        kk = g * G + tl.arange(0, G)
        tl.store(out_ptr + rowc[:, None] * so + kk[None, :], (w * s[:, None]).to(dt), mask=live & (kk[None, :] < K))


def reserve(numel: int, device: torch.device, dtype: torch.dtype) -> None:
    """Make the scratch of (device, dtype) hold at least `numel` elements (call before capture)."""
    key = (torch.device(device), dtype)
    cur = _SCRATCH.get(key)
    if cur is None or cur.numel() < numel:
        _SCRATCH.pop(key, None)
        _SCRATCH[key] = torch.empty(numel, dtype=dtype, device=device)


def _scratch(numel: int, offset: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    reserve(offset + numel, device, dtype)
    return _SCRATCH[(torch.device(device), dtype)][offset : offset + numel]


def dequantize(w: QuantWeight, dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
    """w decoded into the scratch (elements [offset, offset + numel)) -> a tensor of w's logical shape.
    The result is valid until the next call that writes the same range."""
    r, k = w.rows, w.k
    out = _scratch(r * k, offset, w.device, dtype).view(r, k)
    high = high_words(w)
    groups = w.scale.shape[1]
    gpp = 1 if w.fmt.kind == "fp8" else GROUPS_PER_PROGRAM  # fp8 blocks are 128 lanes already
    _dequant_kernel[(triton.cdiv(r, BLOCK_ROWS), triton.cdiv(groups, gpp))](
        w.base, high, w.scale, out, r, k, w.n, groups, w.base.stride(0), high.stride(0), w.scale.stride(0),
        out.stride(0), FMT=_FMT_IDS[w.fmt.name], BLOCK=BLOCK_ROWS, GPP=gpp, num_warps=4,
    )  # fmt: skip
    return out.view(w.shape)
