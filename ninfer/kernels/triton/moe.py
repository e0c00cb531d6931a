"""MoE decode kernels (Triton): fused router (softmax, top-k, renorm) and expert GEMMs for few rows.

`moe_route` replaces softmax + topk + sum + div + cast (five launches) with one. `moe_experts_small`
computes the routed experts of N <= 64 tokens (N·k <= 384 rows: decode and speculative verify) in
three launches without a sort, a gather of weights, an index_add, an atomic or a host sync
(`moe_kernels`). The gate/up and the down kernel each read every distinct chosen expert's weights
once for all the tokens routed to it (duplicates are found in the kernel; their programs exit), so
both grids scale with the distinct experts: gate/up writes act = silu(gate)·up [N·k, Ie], down
writes each (token, expert) row's weighted output z [N·k, H], and a small kernel sums each token's
k rows of z in fp32, in slot order (deterministic). Roundings follow `moe_ref`: the projections,
silu, the product and the weighted output are rounded to the activation dtype; the sum over
experts stays fp32 (as in the grouped path; the reference loop adds in the activation dtype in
ascending expert id).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer.formats import QuantWeight
from ninfer.kernels.triton import pdl
from ninfer.kernels.triton._checks import check_devices, check_int_index
from ninfer.kernels.triton.moe_kernels import down_kernel, expert_sum_kernel, gate_up_kernel
from ninfer.kernels.triton.moe_qkernels import down_q_kernel, gate_up_q_kernel
from ninfer.kernels.triton.pdl import pdl_enter
from ninfer.kernels.triton.qgemv import high_words

SMALL_MAX_ROWS = 384  # N·k up to this many (token, expert) rows use `moe_experts_small`
SMALL_MAX_TOKENS = 64  # ... and N up to this many tokens (the gate/up kernel holds all N in a tile)
SM_COUNT = 132  # H200; only sizes the launch grid
SUM_BLOCK = 512  # columns per program of the slot-order sum


@triton.jit
def _route_kernel(
    logits_ptr, idx_ptr, w_ptr,  # [N, E], [N, K] int64, [N, K]
    E, s_l, s_i, s_w,
    K: tl.constexpr,
    KP: tl.constexpr,  # K rounded up to a power of two
    BE: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.py)
):  # fmt: skip
    pdl_enter(PDL)
    n = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BE)
    mask = offs < E
    x = tl.load(logits_ptr + n * s_l + offs, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    p = e / tl.sum(e, axis=0)
    p = tl.where(mask, p, -1.0)
    kk = tl.arange(0, KP)
    vals = tl.zeros([KP], dtype=tl.float32)
    args = tl.zeros([KP], dtype=tl.int64)
    for j in tl.static_range(K):  # k rounds of argmax: descending order, like torch.topk
        best = tl.max(p, axis=0)
        arg = tl.min(tl.where(p == best, offs, BE), axis=0)  # the lowest index among ties
        vals = tl.where(kk == j, best, vals)
        args = tl.where(kk == j, arg.to(tl.int64), args)
        p = tl.where(offs == arg, -1.0, p)
    total = tl.sum(vals, axis=0)
    tl.store(idx_ptr + n * s_i + kk, args, mask=kk < K)
    tl.store(w_ptr + n * s_w + kk, (vals / total).to(w_ptr.dtype.element_ty), mask=kk < K)


def moe_route(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Router of `SparseMoE`: softmax in fp32, top-k, renormalise, cast to the logits' dtype.

    logits: [N, E]. returns (topk_idx [N, k] int64, topk_w [N, k] in logits' dtype).
    """
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"logits must be [N, E] with a contiguous last dim; got {tuple(logits.shape)}")
    n, e = logits.shape
    if not 1 <= k <= e:
        raise ValueError(f"top-k {k} must lie in 1..E={e}")
    check_devices(logits)
    idx = torch.empty(n, k, dtype=torch.int64, device=logits.device)
    w = torch.empty(n, k, dtype=logits.dtype, device=logits.device)
    if n:
        _route_kernel[(n,)](logits, idx, w, e, logits.stride(0), idx.stride(0), w.stride(0),
                            K=k, KP=triton.next_power_of_2(k), BE=triton.next_power_of_2(e),
                            num_warps=4, **pdl.launch(logits))  # fmt: skip
    return idx, w


def moe_experts_small(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_w: torch.Tensor,
    *,
    block_n: int | None = None,
    block_k: int | None = None,
    config: SmallConfig | None = None,
) -> torch.Tensor:
    """`moe_ref.moe_experts`'s contract in three launches (see the module docstring).

    x: [N, H]; gate_up: [E, 2*Ie, H]; down: [E, H, Ie] (last dims contiguous, one dtype, bf16 /
    fp16 / fp32); topk_idx [N, k] int with distinct experts per token; topk_w [N, k].
    returns [N, H] in x's dtype. block_n / block_k override the shape heuristic (both GEMM kernels);
    `config` replaces it whole (the micro-benchmark's sweep).
    """
    n, k = topk_idx.shape
    e, two_ie, h = gate_up.shape
    ie = two_ie // 2
    if x.shape != (n, h) or down.shape != (e, h, ie) or topk_w.shape != (n, k):
        raise ValueError(
            f"x {tuple(x.shape)}, gate_up {tuple(gate_up.shape)}, down {tuple(down.shape)}, "
            f"topk {tuple(topk_idx.shape)}/{tuple(topk_w.shape)} do not fit [N,H], [E,2Ie,H], [E,H,Ie], [N,k]"
        )
    if n > SMALL_MAX_TOKENS:
        raise ValueError(f"moe_experts_small takes at most {SMALL_MAX_TOKENS} tokens; got {n}")
    if not (x.dtype == gate_up.dtype == down.dtype) or x.dtype not in _DOT_DTYPES:
        raise TypeError(
            f"x, gate_up, down must share one of bf16/fp16/fp32; got {x.dtype}, {gate_up.dtype}, {down.dtype}"
        )
    check_int_index("topk_idx", topk_idx)
    check_devices(x, gate_up, down, topk_idx, topk_w)
    for name, t in (("x", x), ("gate_up", gate_up), ("down", down)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim")
    idx, tw = topk_idx.reshape(-1).contiguous(), topk_w.reshape(-1).contiguous()  # [N*k]
    act = torch.empty(n * k, ie, dtype=x.dtype, device=x.device)
    z = torch.empty(n * k, h, dtype=x.dtype, device=x.device)  # weighted output of each (token, expert)
    y = torch.empty(n, h, dtype=x.dtype, device=x.device)
    if n == 0:
        return y
    prec = "ieee" if x.dtype == torch.float32 else "tf32"  # tf32 only names the default: 16-bit inputs
    cfg = config or pick_config(n, k, e, h, ie, block_n, block_k, elem_size=x.element_size())
    kp, np_ = triton.next_power_of_2(k), max(16, triton.next_power_of_2(n))
    gate_up_kernel[(n * k, triton.cdiv(ie, cfg.gate_up_bn))](
        x, gate_up, idx, act, n, h, ie, x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0),
        K=k, KP=kp, NP=np_, BN=cfg.gate_up_bn, BK=cfg.gate_up_bk, PREC=prec,
        num_warps=cfg.gate_up_warps, num_stages=cfg.gate_up_stages, **pdl.launch(x),
    )  # fmt: skip
    down_kernel[(n * k, triton.cdiv(h, cfg.down_bn))](
        act, down, idx, tw, z, n, h, ie, act.stride(0), down.stride(0), down.stride(1), z.stride(0),
        K=k, KP=kp, NP=np_, BN=cfg.down_bn, BK=cfg.down_bk, PREC=prec,
        num_warps=cfg.down_warps, num_stages=cfg.down_stages, **pdl.launch(x),
    )  # fmt: skip
    block = min(SUM_BLOCK, triton.next_power_of_2(h))
    expert_sum_kernel[(n, triton.cdiv(h, block))](
        z, y, h, z.stride(0), y.stride(0), K=k, BLOCK=block, num_warps=4, **pdl.launch(x)
    )
    return y


_DOT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FMT_IDS = {"q4_g64": 0, "q5_g64": 1, "q6_g64": 2, "q8_g32": 3, "fp8_e4m3_b128": 4}


def moe_experts_small_quantized(
    x: torch.Tensor,
    gate_up: QuantWeight,
    down: QuantWeight,
    topk_idx: torch.Tensor,
    topk_w: torch.Tensor,
    *,
    block_n: int | None = None,
    magic: bool = True,
) -> torch.Tensor:
    """`moe_experts_small` over quantized banks (gate_up [E, 2*Ie, H], down [E, H, Ie] as
    `QuantWeight`s): the same three launches, each weight group decoded from its codes and scales
    (`moe_qkernels`). `magic`: bit-operation decoding (False: plain conversions, the interpreter's)."""
    n, k = topk_idx.shape
    e, two_ie, h = gate_up.shape
    ie = two_ie // 2
    if len(gate_up.shape) != 3 or down.shape != (e, h, ie) or x.shape != (n, h) or topk_w.shape != (n, k):
        raise ValueError(
            f"x {tuple(x.shape)}, gate_up {gate_up.shape}, down {down.shape}, topk {tuple(topk_idx.shape)} "
            "do not fit [N,H], [E,2Ie,H], [E,H,Ie], [N,k]"
        )
    if n > SMALL_MAX_TOKENS:
        raise ValueError(f"moe_experts_small takes at most {SMALL_MAX_TOKENS} tokens; got {n}")
    if x.dtype not in _DOT_DTYPES:
        raise TypeError(f"x must be bf16 / fp16 / fp32; got {x.dtype}")
    check_int_index("topk_idx", topk_idx)
    check_devices(x, gate_up.base, down.base, topk_idx, topk_w)
    x = x.contiguous()
    idx, tw = topk_idx.reshape(-1).contiguous(), topk_w.reshape(-1).contiguous()
    act = torch.empty(n * k, ie, dtype=x.dtype, device=x.device)
    z = torch.empty(n * k, h, dtype=x.dtype, device=x.device)
    y = torch.empty(n, h, dtype=x.dtype, device=x.device)
    if n == 0:
        return y
    cfg = pick_config(n, k, e, h, ie, block_n, None, elem_size=x.element_size())
    kp, np_ = triton.next_power_of_2(k), max(16, triton.next_power_of_2(n))
    xdt = _DOT_DTYPES.index(x.dtype)
    xdt = {0: 1, 1: 2, 2: 0}[xdt]  # kernels' XDT: 0 fp32, 1 bf16, 2 fp16
    for name, w, kern, rows_out, groups in (
        ("gate_up", gate_up, gate_up_q_kernel, cfg.gate_up_bn, _groups(gate_up)),
        ("down", down, down_q_kernel, cfg.down_bn, _groups(down)),
    ):
        high = high_words(w)
        fmt = _FMT_IDS[w.fmt.name]
        if name == "gate_up":
            kern[(n * k, triton.cdiv(ie, rows_out))](
                x, w.base, high, w.scale, idx, act, n, h, ie, groups,
                x.stride(0), w.base.stride(0), high.stride(0), w.scale.stride(0), act.stride(0),
                K=k, KP=kp, NP=np_, BN=rows_out, FMT=fmt, MAGIC=magic, XDT=xdt,
                num_warps=4, num_stages=3, **pdl.launch(x),
            )  # fmt: skip
        else:
            kern[(n * k, triton.cdiv(h, rows_out))](
                act, w.base, high, w.scale, idx, tw, z, n, h, ie, groups,
                act.stride(0), w.base.stride(0), high.stride(0), w.scale.stride(0), z.stride(0),
                K=k, KP=kp, NP=np_, BN=rows_out, FMT=fmt, MAGIC=magic, XDT=xdt,
                num_warps=4, num_stages=3, **pdl.launch(x),
            )  # fmt: skip
    block = min(SUM_BLOCK, triton.next_power_of_2(h))
    expert_sum_kernel[(n, triton.cdiv(h, block))](
        z, y, h, z.stride(0), y.stride(0), K=k, BLOCK=block, num_warps=4, **pdl.launch(x)
    )
    return y


def _groups(w: QuantWeight) -> int:
    """Scale groups along K of a bank's rows (fp8: 128-lane blocks)."""
    return w.scale.shape[1]


@dataclass(frozen=True)
class SmallConfig:
    """Launch shape of the two GEMM kernels: output columns (gate/up) or rows (down) per program,
    reduction chunk, warps and pipeline stages."""

    gate_up_bn: int
    gate_up_bk: int
    down_bn: int
    down_bk: int
    gate_up_warps: int = 4
    gate_up_stages: int = 4
    down_warps: int = 4
    down_stages: int = 4


def pick_config(
    n: int,
    k: int,
    e: int,
    h: int,
    ie: int,
    block_n: int | None = None,
    block_k: int | None = None,
    *,
    elem_size: int = 2,
) -> SmallConfig:
    """Shape heuristic (no autotune: graph capture): the widest tiles that still give >= 2 working
    programs per SM in each kernel (distinct experts x tiles), counting the expected number of
    distinct experts among N·k random picks of E. The reduction chunk is 256 bytes of a weight row
    (128 bf16, 64 fp32): wider fp32 tiles exceed sm_90's shared memory in the pipelined loops."""
    distinct = e * (1.0 - (1.0 - 1.0 / e) ** (n * k))
    gu_bn = block_n or _widest(lambda bn: distinct * triton.cdiv(ie, bn))
    dn_bn = block_n or _widest(lambda bn: distinct * triton.cdiv(h, bn))
    chunk = 256 // elem_size
    gu_bk = block_k or min(chunk, triton.next_power_of_2(h))
    dn_bk = block_k or min(chunk, triton.next_power_of_2(ie))
    return SmallConfig(max(16, gu_bn), max(16, gu_bk), max(16, dn_bn), max(16, dn_bk))


def _widest(programs: Callable[[int], float]) -> int:
    for bn in (64, 32):
        if programs(bn) >= 2 * SM_COUNT:
            return bn
    return 16
