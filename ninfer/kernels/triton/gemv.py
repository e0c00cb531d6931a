"""Decode GEMV (Triton): y[M,N] = x[M,K] @ W[N,K]^T for few rows (M <= 16), memory-bound on W.

Each program reads a [BLOCK_N, BLOCK_K] tile of W per step along K (rows of W are contiguous in
K, so the loads are wide and coalesced) and every weight byte is read once. Small N or long K
is split along K so that every shape launches enough programs to fill the GPU; the splits write
fp32 partial sums to a workspace [SPLIT, M, N] and a second launch adds them in split order, so
the result does not depend on scheduling (no atomics). Unsplit shapes write y directly. fp32
accumulation always; one row (two in fp32) runs on the CUDA cores (broadcast multiply, one
reduction at the end), more rows on the tensor cores (`tl.dot`, rows padded to 16; fp32 in IEEE
precision, never TF32). Configs come from a shape
heuristic (`pick_config`), never from run-time autotuning, so a call can be graph-captured.

`act="swiglu"` folds the MLP activation into the x load: x is the fused gate | up output
[..., 2K] and each tile computes silu(gate) * up with the roundings of `gates.silu_mul` (the
product silu(g) and the result rounded to the activation dtype), so the result is bit-identical
to `gemv(gates.silu_mul(g, u), weight)` under the same config, one launch fewer (every N block
recomputes the activation of its K range from gate and up: ALU work and twice the x bytes, both
small next to the weight stream).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton import knobs

from ninfer.kernels.triton import pdl
from ninfer.kernels.triton._checks import check_devices
from ninfer.kernels.triton.pdl import pdl_enter, pdl_trigger, pdl_wait

MAX_ROWS = 16  # M above this (prefill) goes to torch.nn.functional.linear
NUM_SMS = 132  # H200; the grid target is a few programs per SM
LM_HEAD_N = 131072  # N from here on: vocabulary-wide output (its own tile shape)
SMALL_ELEMS = 1 << 22  # 2..16 rows: weights up to this many elements take the GEMV (`gemv_wins`)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class GemvConfig:
    """Launch parameters of one GEMV call (powers of two; `split` programs share one N block)."""

    block_m: int
    block_n: int
    block_k: int
    split: int
    num_warps: int
    num_stages: int
    use_dot: bool


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, y_ptr,  # x [M, K] (row stride sx), W [N, K] (row stride sw), y [M, N] or ws [SPLIT, M, N] fp32
    M, N, K, K_PER_SPLIT,
    sx, su, sw, sy_split, sy,  # su: offset of up from gate within a row of x (ACT 1)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    IEEE: tl.constexpr,  # fp32 tiles in tl.dot: full precision, never TF32
    EVEN_K: tl.constexpr,  # K_PER_SPLIT and K are multiples of BLOCK_K: no masks along K
    ACT: tl.constexpr,  # 0: x as stored; 1: x = silu(gate) * up, gate at x, up at x + su
    PDL: tl.constexpr,  # programmatic dependent launch (see pdl.py)
):  # fmt: skip
    pdl_trigger(PDL)
    dt = x_ptr.dtype.element_ty
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    # rows past the end are clamped (read again, never stored): the loads stay unmasked along N / M
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)
    rows_x = tl.minimum(offs_m, M - 1).to(tl.int64)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    offs_k = k_lo + tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows_w[:, None] * sw + offs_k[None, :]  # [BLOCK_N, BLOCK_K]
    x_ptrs = x_ptr + rows_x[:, None] * sx + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    touched = 0.0
    if PDL:
        if BLOCK_K >= 64:  # W depends on no kernel: fetch this program's first lines while the last one ends
            lines = k_lo + tl.arange(0, BLOCK_K // 64) * 64  # one element per 128-byte line (bf16)
            early = tl.load(
                w_ptr + rows_w[:, None] * sw + lines[None, :], mask=lines[None, :] < k_hi, other=0.0
            )
            pdl_wait(PDL)
            touched = tl.where(M < 0, tl.sum(early.to(tl.float32)), 0.0)  # never true: keeps the load, adds 0
        else:
            pdl_wait(PDL)
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc3 = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs)
            x = tl.load(x_ptrs)
            if ACT == 1:
                u = tl.load(x_ptrs + su)
        else:
            kmask = (k0 + tl.arange(0, BLOCK_K)) < k_hi
            w = tl.load(w_ptrs, mask=kmask[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=kmask[None, :], other=0.0)
            if ACT == 1:
                u = tl.load(x_ptrs + su, mask=kmask[None, :], other=0.0)
        if ACT == 1:  # the roundings of gates._gate_kernel OP 1 (masked lanes: silu(0) * 0 = 0)
            g = x.to(tl.float32)
            x = ((g * tl.sigmoid(g)).to(dt).to(tl.float32) * u.to(tl.float32)).to(dt)
        if USE_DOT:
            if IEEE:
                acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc)
        else:
            acc3 += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if not USE_DOT:
        acc = tl.sum(acc3, axis=2)
    acc += touched
    y_ptrs = y_ptr + pid_k * sy_split + offs_m[:, None] * sy + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _split_sum_kernel(
    ws_ptr, y_ptr,  # ws [SPLIT, M*N] fp32 -> y [M*N] (contiguous)
    MN,
    SPLIT: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT):  # fixed order: deterministic
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def pick_config(
    m: int, n: int, k: int, dtype: torch.dtype, num_sms: int = NUM_SMS, act: str | None = None
) -> GemvConfig:
    """The launch config of a [m, k] x [n, k]^T GEMV by shape (see the module docstring).

    From a sweep of the 27B / 35B-A3B projections on an H200 (bf16, CUDA graphs, L2 defeated):
    one row runs fastest on the CUDA cores with 8 x 512 tiles; 2..16 rows on the tensor cores
    with 64 x 256 tiles (64 x 128 for very long K, 128 x 128 and 8 warps for the vocabulary-wide
    lm_head), about 4 programs per SM after the split along K. act "swiglu" keeps the tiles and
    the split (so the sums are those of the plain GEMV) but gives `tl.dot` tiles at least 8 warps:
    the activation's fp32 tiles spill registers at 4 warps on sm_90 (64 x 256 tiles, bf16).
    """
    fp32 = dtype == torch.float32
    use_dot = m > 2 or (m == 2 and not fp32)
    warps, stages, target = 4, 3, 4
    if not use_dot:
        block_m, block_n, block_k = triton.next_power_of_2(m), 8, 256 if fp32 else 512
    elif fp32:
        block_m, block_n, block_k = 16, 32, 64
    elif n >= LM_HEAD_N:
        block_m, block_n, block_k, warps, target = 16, 128, 128, 8, 2
    elif k >= 16384:
        block_m, block_n, block_k, stages = 16, 64, 128, 4
    else:
        block_m, block_n, block_k = 16, 64, 256
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    n_blocks = triton.cdiv(n, block_n)
    k_steps = triton.cdiv(k, block_k)
    split = 1
    if n_blocks < target * num_sms:  # few N blocks: split K, keeping >= 4 steps per program
        split = min(triton.cdiv(target * num_sms, n_blocks), max(1, k_steps // 4), 32)
    if act is not None and use_dot:
        warps = max(warps, 8)
    return GemvConfig(block_m, block_n, block_k, split, warps, stages, use_dot)


def gemv_wins(m: int, n: int, k: int) -> bool:
    """Whether the GEMV beat cuBLAS (F.linear) at this shape on the H200 (bf16, L2 defeated).

    Measured (ops/bench/gemv_micro.py): one row is as fast or faster everywhere except wide
    outputs over K <= 2048 (35B-A3B q|gate, qkv: ~10 % slower); 2..16 rows only for small
    weights (<= SMALL_ELEMS; 257 x 2048 and 1024 x 2048 up to 1.7x faster, others within
    ~0.2 µs) of at least 64 outputs (N = 1 / 32: the split-K's second launch costs 0.4-2.5 µs)
    and the lm_head (4-7 % faster); cuBLAS was 5-20 % faster in between.
    """
    if n >= LM_HEAD_N:
        return True
    if m == 1:
        return not (k <= 2048 and n >= 8192)
    return 64 <= n and n * k <= SMALL_ELEMS


# read once at import (the kernel tests set TRITON_INTERPRET before importing kernels): torch.compile
# cannot trace Triton's C getenv inside the decode step
_INTERPRET = bool(knobs.runtime.interpret)
# whether `linear` sends CPU tensors through the kernel under the interpreter (the kernel tests);
# whole-model interpreter tests turn it off: the GEMV has its own tests, and interpreting it for
# every projection multiplies their run time
INTERPRETER_DISPATCH = _INTERPRET


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` runs the Triton GEMV for these arguments (else torch.nn.functional.linear)."""
    if x.dim() == 0 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        return False
    m = x.numel() // max(1, x.shape[-1])
    on_device = x.device.type == "cuda" or (x.device.type == "cpu" and INTERPRETER_DISPATCH)
    return (
        on_device
        and 1 <= m <= MAX_ROWS
        and gemv_wins(m, *weight.shape)
        and x.dtype in _DTYPES
        and weight.dtype == x.dtype
        and weight.device == x.device
        and weight.stride(1) == 1
    )


def gemv(
    x: torch.Tensor, weight: torch.Tensor, config: GemvConfig | None = None, *, act: str | None = None
) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T -> [..., N] in x's dtype, for prod(x.shape[:-1]) <= MAX_ROWS.

    weight must be contiguous along K (any row stride); x any layout (copied if its rows cannot
    be viewed). act "swiglu": x is [..., 2K] (gate | up) and the product is
    silu(x[..., :K]) * x[..., K:] @ weight^T, bit-identical to `gemv(gates.silu_mul(g, u), weight)`.
    `config` overrides the shape heuristic (tests).
    """
    if act not in (None, "swiglu"):
        raise ValueError(f"act must be None or 'swiglu'; got {act!r}")
    width = weight.shape[-1] * (1 if act is None else 2) if weight.dim() == 2 else -1  # K or 2K (gate | up)
    if x.dim() == 0 or x.shape[-1] != width:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} do not chain (act {act})")
    if x.dtype not in _DTYPES or weight.dtype != x.dtype:
        raise TypeError(f"x and weight must share a float32/bf16/fp16 dtype; got {x.dtype}, {weight.dtype}")
    if weight.stride(1) != 1:
        raise ValueError(f"weight must be contiguous along K (stride {weight.stride()})")
    check_devices(x, weight)
    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, width)  # [M, K] or [M, 2K]
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows; got {m} (use torch.nn.functional.linear)")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)  # [M, N]
    if m == 0 or n == 0:
        return y.view(*lead, n)
    if k == 0:
        return y.zero_().view(*lead, n)
    cfg = config or pick_config(m, n, k, x.dtype, act=act)
    if cfg.block_m < m:
        raise ValueError(f"config block_m {cfg.block_m} < rows {m}")
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, k_per_split)  # no empty splits
    out = y if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, cfg.block_n), split)
    _gemv_kernel[grid](
        x2, weight, out, m, n, k, k_per_split,
        x2.stride(0), 0 if act is None else k, weight.stride(0), 0 if split == 1 else m * n, n,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, USE_DOT=cfg.use_dot,
        IEEE=x.dtype == torch.float32, EVEN_K=k % cfg.block_k == 0 and k_per_split % cfg.block_k == 0,
        ACT=0 if act is None else 1, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl.launch(x2),
    )  # fmt: skip
    if split > 1:
        block = 1024
        _split_sum_kernel[(triton.cdiv(m * n, block),)](
            out, y, m * n, SPLIT=split, BLOCK=block, num_warps=4, **pdl.launch(x2)
        )
    return y.view(*lead, n)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`Ops.linear` without the custom-op wrapper: the GEMV for few rows, else F.linear."""
    if use_gemv(x, weight):
        return gemv(x, weight)
    return torch.nn.functional.linear(x, weight)
