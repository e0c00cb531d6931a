"""MoE decode kernels (Triton): fused router (softmax, top-k, renorm) and expert GEMVs for few rows.

`moe_route` replaces softmax + topk + sum + div + cast (five launches) with one. `moe_experts_small`
computes the routed experts of N tokens (N·k ≤ a few dozen rows) in two launches without a sort,
a gather of weights or an index_add: the first reads each chosen expert's gate/up rows once and
writes act = silu(gate)·up [N·k, Ie]; the second reads each token's k down projections and sums
the weighted outputs in fp32. Roundings follow `moe_ref`: the projections, silu, the product and
the weighted output are rounded to the activation dtype; the sum over experts stays fp32 (as in
the grouped path; the reference loop adds in the activation dtype in ascending expert id).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton._checks import check_devices, check_int_index

SMALL_MAX_ROWS = 64  # N·k up to this many (token, expert) rows use `moe_experts_small`


@triton.jit
def _route_kernel(
    logits_ptr, idx_ptr, w_ptr,  # [N, E], [N, K] int64, [N, K]
    E, s_l, s_i, s_w,
    K: tl.constexpr,
    KP: tl.constexpr,  # K rounded up to a power of two
    BE: tl.constexpr,
):  # fmt: skip
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
                            num_warps=4)  # fmt: skip
    return idx, w


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, idx_ptr, act_ptr,  # x [N, H]; w [E, 2*Ie, H]; idx [N*K]; act [N*K, Ie]
    H, IE,
    s_x, s_we, s_wr, s_a,
    K: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):  # fmt: skip
    m = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    mask_n = offs_n < IE
    e = tl.load(idx_ptr + m).to(tl.int64)
    x_row = x_ptr + (m // K) * s_x
    w_gate = w_ptr + e * s_we + offs_n[:, None] * s_wr
    w_up = w_gate + IE * s_wr
    acc_g = tl.zeros([BN], dtype=tl.float32)
    acc_u = tl.zeros([BN], dtype=tl.float32)
    for k0 in range(0, H, BK):
        offs_k = k0 + tl.arange(0, BK)
        mask_k = offs_k < H
        x = tl.load(x_row + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        m2 = mask_n[:, None] & mask_k[None, :]
        acc_g += tl.sum(tl.load(w_gate + offs_k[None, :], mask=m2, other=0.0).to(tl.float32) * x[None, :], 1)
        acc_u += tl.sum(tl.load(w_up + offs_k[None, :], mask=m2, other=0.0).to(tl.float32) * x[None, :], 1)
    dt = act_ptr.dtype.element_ty
    g = acc_g.to(dt).to(tl.float32)
    u = acc_u.to(dt).to(tl.float32)
    act = (g * tl.sigmoid(g)).to(dt).to(tl.float32) * u
    tl.store(act_ptr + m * s_a + offs_n, act.to(dt), mask=mask_n)


@triton.jit
def _down_kernel(
    act_ptr, w_ptr, idx_ptr, tw_ptr, y_ptr,  # act [N*K, Ie]; w [E, H, Ie]; idx, tw [N*K]; y [N, H]
    H, IE,
    s_a, s_we, s_wr, s_y,
    K: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    mask_n = offs_n < H
    dt = y_ptr.dtype.element_ty
    out = tl.zeros([BN], dtype=tl.float32)
    for j in tl.static_range(K):
        m = n * K + j
        e = tl.load(idx_ptr + m).to(tl.int64)
        wt = tl.load(tw_ptr + m).to(tl.float32)
        w_rows = w_ptr + e * s_we + offs_n[:, None] * s_wr
        acc = tl.zeros([BN], dtype=tl.float32)
        for k0 in range(0, IE, BK):
            offs_k = k0 + tl.arange(0, BK)
            mask_k = offs_k < IE
            a = tl.load(act_ptr + m * s_a + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            wv = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            acc += tl.sum(wv.to(tl.float32) * a[None, :], 1)
        out += (acc.to(dt).to(tl.float32) * wt).to(dt).to(tl.float32)
    tl.store(y_ptr + n * s_y + offs_n, out.to(dt), mask=mask_n)


def moe_experts_small(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_w: torch.Tensor,
    *,
    block_n: int | None = None,
    block_k: int = 128,
) -> torch.Tensor:
    """`moe_ref.moe_experts`'s contract in two launches (see the module docstring).

    x: [N, H]; gate_up: [E, 2*Ie, H]; down: [E, H, Ie] (last dims contiguous); topk_idx [N, k] int;
    topk_w [N, k]. returns [N, H] in x's dtype.
    """
    n, k = topk_idx.shape
    e, two_ie, h = gate_up.shape
    ie = two_ie // 2
    if x.shape != (n, h) or down.shape != (e, h, ie) or topk_w.shape != (n, k):
        raise ValueError(
            f"x {tuple(x.shape)}, gate_up {tuple(gate_up.shape)}, down {tuple(down.shape)}, "
            f"topk {tuple(topk_idx.shape)}/{tuple(topk_w.shape)} do not fit [N,H], [E,2Ie,H], [E,H,Ie], [N,k]"
        )
    check_int_index("topk_idx", topk_idx)
    check_devices(x, gate_up, down, topk_idx, topk_w)
    for name, t in (("x", x), ("gate_up", gate_up), ("down", down)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim")
    idx, tw = topk_idx.reshape(-1).contiguous(), topk_w.reshape(-1).contiguous()  # [N*k]
    act = torch.empty(n * k, ie, dtype=x.dtype, device=x.device)
    y = torch.empty(n, h, dtype=x.dtype, device=x.device)
    if n == 0:
        return y
    bk = min(block_k, triton.next_power_of_2(max(h, ie)))
    bn1 = block_n or _block_n(n * k, ie)
    _gate_up_kernel[(n * k, triton.cdiv(ie, bn1))](
        x, gate_up, idx, act, h, ie, x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0),
        K=k, BN=bn1, BK=bk, num_warps=4,
    )  # fmt: skip
    bn2 = block_n or _block_n(n, h)
    _down_kernel[(n, triton.cdiv(h, bn2))](
        act, down, idx, tw, y, h, ie, act.stride(0), down.stride(0), down.stride(1), y.stride(0),
        K=k, BN=bn2, BK=min(block_k, triton.next_power_of_2(ie)), num_warps=4,
    )  # fmt: skip
    return y


def _block_n(rows: int, cols: int) -> int:
    """Output rows per program: the largest of 16..64 that still gives >= 256 programs (H200: 132 SMs)."""
    for bn in (64, 32):
        if rows * triton.cdiv(cols, bn) >= 256:
            return bn
    return 16
