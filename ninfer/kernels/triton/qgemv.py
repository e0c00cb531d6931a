"""Quantized decode GEMV / small GEMM (Triton): y[M, N] = x[M, K] @ dequant(W)[N, K]^T for few rows,
reading W's packed codes and scales directly (the bytes a step streams are the format's bytes).

One loop iteration covers GPS scale groups of G lanes of BLOCK_N rows (groupwise: G = 64 for
Q4 / Q5 / Q6, 32 for W8; fp8: a 128-lane block, one scale per 128 x 128 block), unrolled so their
loads are in flight together. A group's codes are decoded to exact values in registers in their lane
order (`qdecode.decode_group`), multiplied with x (fp32 products and sums) and scaled by the group's
scale, which equals sum_k x_k (q_k s) up to fp32 rounding. Decoding (`MAGIC`): 1 builds each code's
value with bit operations and one add (for bf16 tiles the bf16 offset is removed after the dot by
the group's x sum), avoiding the slow integer-to-float conversions; 0 converts plainly (the
reference of 1).

`USE_DOT`: the group's [BLOCK_M, G] x [G, BLOCK_N] product on the tensor cores (rows padded to 16);
else broadcast multiplies on the CUDA cores accumulated per lane and reduced once at the end (one or
two rows). Long K is split across programs into fp32 partials summed in a fixed order by a second
launch (`gemv._split_sum_kernel`), so results do not depend on scheduling. Configs come from a
shape heuristic (`pick_config`), never from run-time autotuning, so a call can be graph-captured.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from ninfer.formats import QuantWeight
from ninfer.kernels.triton import pdl, qgemv_mma
from ninfer.kernels.triton.gemv import _INTERPRET, NUM_SMS, _split_sum_kernel
from ninfer.kernels.triton.pdl import pdl_enter
from ninfer.kernels.triton.qdecode import decode_group, decode_group_parity
from ninfer.kernels.triton.qgemv_lanes import launch_lanes
from ninfer.kernels.triton.qgemv_words import chunk_words, qgemv_words_kernel, row_words

MAX_ROWS = 64  # M above this goes to dequantize + torch.nn.functional.linear (`dequant.py`)
FMT_IDS = {"q4_g64": 0, "q5_g64": 1, "q6_g64": 2, "q8_g32": 3, "fp8_e4m3_b128": 4}
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class QGemvConfig:
    """Launch parameters of one quantized GEMV call."""

    block_m: int
    block_n: int
    split: int  # programs along K sharing one N block
    num_warps: int
    num_stages: int
    use_dot: bool
    magic: bool
    gps: int = 4  # scale groups per loop iteration
    parity: bool = False  # Q4 / Q5 / Q6 lanes kept apart by parity (x split to match)
    words: int = 0  # one row of a groupwise format: `qgemv_words` with this many words a row per iteration
    thread_rows: int = 0  # with words: the Gluon kernel `qgemv_lanes` on the GPU, this many rows a thread
    mma_tiles: int = 0  # Q4 / Q5 / Q6, bf16, <= 8 rows on sm_80+: `qgemv_mma` (16-row tiles a warp, gps a loop)


@triton.jit
def _qgemv_kernel(
    x_ptr, base_ptr, high_ptr, scale_ptr, y_ptr,
    M, N, K, GROUPS, G_PER_SPLIT,
    sx, sb, sh, ss, sy_split, sy,
    FMT: tl.constexpr,  # 0 q4 1 q5 2 q6 3 w8 4 fp8
    XDT: tl.constexpr,  # x's dtype: 0 fp32, 1 bf16, 2 fp16
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GPS: tl.constexpr,  # scale groups per loop iteration (unrolled: their loads are in flight together)
    PARITY: tl.constexpr,  # Q4 / Q5 / Q6: even and odd lanes apart (x split to match) instead of rejoined
    USE_DOT: tl.constexpr,
    MAGIC: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    IEEE: tl.constexpr = XDT == 0
    BF16_MAGIC: tl.constexpr = MAGIC and USE_DOT and XDT == 1 and FMT < 3
    cdt: tl.constexpr = (
        (tl.float32 if XDT == 0 else (tl.bfloat16 if XDT == 1 else tl.float16)) if USE_DOT else tl.float32
    )
    G: tl.constexpr = 64 if FMT < 3 else (32 if FMT == 3 else 128)
    SIGN: tl.constexpr = 8 if FMT == 0 else (16 if FMT == 1 else 32)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)  # rows past the end are read again, never stored
    rows_x = tl.minimum(offs_m, M - 1).to(tl.int64)
    g_lo = pid_k * G_PER_SPLIT
    g_hi = tl.minimum(g_lo + G_PER_SPLIT, GROUPS)
    SPLIT_LANES: tl.constexpr = PARITY and FMT < 3
    ACC_LANES: tl.constexpr = G // 2 if SPLIT_LANES else G
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc3 = tl.zeros([BLOCK_M, BLOCK_N, ACC_LANES], dtype=tl.float32)
    if FMT == 4:
        srow = rows_w // 128  # the row's 128-row scale block
    else:
        srow = rows_w
    lanes = tl.arange(0, G)
    for g0 in range(g_lo, g_hi, GPS):
        for i in tl.static_range(GPS):
            g = tl.minimum(g0 + i, g_hi - 1)  # past the split's end: read again, counted 0
            k_off = g * G + lanes
            x = tl.load(x_ptr + rows_x[:, None] * sx + k_off[None, :], mask=k_off[None, :] < K, other=0.0)
            if SPLIT_LANES:
                we, wo, s = decode_group_parity(
                    base_ptr, high_ptr, scale_ptr, rows_w, srow, g, sb, sh, ss, FMT, MAGIC, BF16_MAGIC, cdt
                )
                xe, xo = tl.split(tl.reshape(x, (BLOCK_M, G // 2, 2)))  # [BM, G/2]: x[2j], x[2j + 1]
            else:
                we, s = decode_group(
                    base_ptr, high_ptr, scale_ptr, rows_w, srow, g, K, sb, sh, ss, FMT, MAGIC, BF16_MAGIC, cdt
                )
                wo = we
                xe = x
                xo = x
            s = tl.where(g0 + i < g_hi, s, 0.0)
            if USE_DOT:
                if IEEE:
                    p = tl.dot(xe, tl.trans(we), input_precision="ieee")
                    if SPLIT_LANES:
                        p = tl.dot(xo, tl.trans(wo), p, input_precision="ieee")
                else:
                    p = tl.dot(xe.to(cdt), tl.trans(we))
                    if SPLIT_LANES:
                        p = tl.dot(xo.to(cdt), tl.trans(wo), p)
                if BF16_MAGIC:  # the values were 128 + SIGN + q
                    p = p - (128.0 + SIGN) * tl.sum(x.to(tl.float32), axis=1)[:, None]
                acc += p * s[None, :]
            else:
                part = xe.to(tl.float32)[:, None, :] * we[None, :, :]
                if SPLIT_LANES:
                    part += xo.to(tl.float32)[:, None, :] * wo[None, :, :]
                acc3 += part * s[None, :, None]
    if not USE_DOT:
        acc = tl.sum(acc3, axis=2)
    y_ptrs = y_ptr + pid_k * sy_split + offs_m[:, None] * sy + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _qgemv_row_kernel(
    x_ptr, base_ptr, high_ptr, scale_ptr, y_ptr,
    N, K, GROUPS, G_PER_SPLIT,
    sb, sh, ss, sy_split,
    FMT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GPS: tl.constexpr,
    PARITY: tl.constexpr,
    MAGIC: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """One row of x (batch-1 decode) on the CUDA cores: two-dimensional tiles only, so the decoded
    weights, x and the accumulator share the weight load's layout (no register shuffles a group)."""
    pdl_enter(PDL)
    G: tl.constexpr = 64 if FMT < 3 else (32 if FMT == 3 else 128)
    SPLIT_LANES: tl.constexpr = PARITY and FMT < 3
    ACC_LANES: tl.constexpr = G // 2 if SPLIT_LANES else G
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)
    if FMT == 4:
        srow = rows_w // 128
    else:
        srow = rows_w
    g_lo = pid_k * G_PER_SPLIT
    g_hi = tl.minimum(g_lo + G_PER_SPLIT, GROUPS)
    acc2 = tl.zeros([BLOCK_N, ACC_LANES], dtype=tl.float32)
    lanes = tl.arange(0, G)
    for g0 in range(g_lo, g_hi, GPS):
        for i in tl.static_range(GPS):
            g = tl.minimum(g0 + i, g_hi - 1)  # past the split's end: read again, counted 0
            k_off = g * G + lanes
            x = tl.load(x_ptr + k_off, mask=k_off < K, other=0.0).to(tl.float32)  # [G]
            if SPLIT_LANES:
                we, wo, s = decode_group_parity(
                    base_ptr, high_ptr, scale_ptr, rows_w, srow, g, sb, sh, ss, FMT, MAGIC, False, tl.float32
                )
                xe, xo = tl.split(tl.reshape(x, (G // 2, 2)))
                part = we * xe[None, :] + wo * xo[None, :]
            else:
                w, s = decode_group(
                    base_ptr, high_ptr, scale_ptr, rows_w, srow, g, K, sb, sh, ss, FMT, MAGIC, False, tl.float32
                )
                part = w * x[None, :]
            s = tl.where(g0 + i < g_hi, s, 0.0)
            acc2 += part * s[:, None]
    acc = tl.sum(acc2, axis=1)  # [BN]
    tl.store(y_ptr + pid_k * sy_split + offs_n, acc.to(y_ptr.dtype.element_ty), mask=offs_n < N)


# measured configs (ops/bench/qgemv_micro.py --table): "fmt:n:k:rows" -> config fields; rows is 1 for
# one row and 8 for 2..16 (the tensor-core tiles); shapes it does not name take the heuristic
TABLE_FILE = Path(__file__).with_name("qgemv_configs.json")
TABLE_ENV = "NINFER_QGEMV_TABLE"


@functools.cache
def _table() -> dict[str, dict[str, Any]]:
    path = Path(os.environ.get(TABLE_ENV) or TABLE_FILE)
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return dict(data.get("configs", {}))


def table_key(fmt: str, n: int, k: int, m: int) -> str:
    return f"{fmt}:{n}:{k}:{1 if m == 1 else 8}"


def pick_config(
    m: int, n: int, groups: int, fmt: str, dtype: torch.dtype, num_sms: int = NUM_SMS, k: int = 0, table: bool = True
) -> QGemvConfig:
    """The launch config: the measured one for this (format, shape, rows) when the table has it
    (bf16 activations on the GPU), else by shape: one or two rows on the CUDA cores (32 rows of W a
    program), more on the tensor cores, ~4 programs per SM after the split along K; `magic` decoding
    except under the interpreter."""
    if table and dtype == torch.bfloat16 and not _INTERPRET and m <= 16:
        entry = _table().get(table_key(fmt, n, k, m))
        if entry is not None:
            cfg = QGemvConfig(**{**entry, "block_m": max(entry["block_m"], triton.next_power_of_2(m))})
            if cfg.use_dot or cfg.block_m >= m:
                return cfg
    use_dot = m > 2
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    if not use_dot:
        block_m = triton.next_power_of_2(m)
    # 64-row tensor-core tiles, 32 for fp8 blocks (128 lanes) and fp32 (tests): wider ones spill on sm_90
    block_n = 64 if use_dot and fmt != "fp8_e4m3_b128" and dtype != torch.float32 else 32
    if fmt == "fp8_e4m3_b128" and dtype != torch.float32:  # tensor-core tiles (64 rows spill 16 B on sm_90)
        use_dot, block_m, block_n = True, max(16, block_m), 32
    n_blocks = triton.cdiv(n, block_n)
    split = 1
    target = 4 * num_sms
    if n_blocks < target:
        split = max(1, min(triton.cdiv(target, n_blocks), groups // 4, 32))
    gps = 1 if fmt == "fp8_e4m3_b128" or dtype == torch.float32 else 4
    return QGemvConfig(block_m, block_n, split, 4, 3, use_dot, not _INTERPRET, gps, parity=not use_dot)


def high_words(w: QuantWeight) -> torch.Tensor:
    """The high-bit plane as int32 words [R, Kp * high_bits / 32] (the kernels' view; a copy when the
    bytes are not 4-aligned); the base plane stands in when the format has none (never read)."""
    if w.high is None:
        return w.base
    h = w.high
    if h.stride(-1) != 1 or h.storage_offset() % 4 or h.stride(0) % 4:
        h = h.contiguous().clone()
    return h.view(torch.int32)


def qgemv(x: torch.Tensor, w: QuantWeight, config: QGemvConfig | None = None) -> torch.Tensor:
    """x [..., K] @ dequant(w) [N, K]^T -> [..., N] in x's dtype, for prod(x.shape[:-1]) <= MAX_ROWS."""
    if len(w.shape) != 2 or x.shape[-1] != w.k:
        raise ValueError(f"x {tuple(x.shape)} and weight {w.shape} do not chain")
    if x.dtype not in _DTYPES:
        raise TypeError(f"x must be float32 / bf16 / fp16; got {x.dtype}")
    fmt = FMT_IDS[w.fmt.name]
    n, k = w.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"qgemv takes at most {MAX_ROWS} rows; got {m}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.view(*lead, n)
    groups = w.scale.shape[1] if fmt < 4 else triton.cdiv(k, 128)
    cfg = config or pick_config(m, n, groups, w.fmt.name, x.dtype, k=k)
    use_mma = bool(cfg.mma_tiles) and m <= qgemv_mma.MAX_ROWS and not _INTERPRET and qgemv_mma.supported(x2, fmt)
    if cfg.mma_tiles and not use_mma and config is None:  # the table's mma entry does not apply: the shape's heuristic
        cfg = pick_config(m, n, groups, w.fmt.name, x.dtype, k=k, table=False)
    if cfg.block_m < m:
        raise ValueError(f"config block_m {cfg.block_m} < rows {m}")
    if m == 1 and cfg.words and fmt < 4 and not use_mma:
        _launch_words(x2, w, y, cfg, fmt, n, k)
        return y.view(*lead, n)
    per_split = triton.cdiv(groups, cfg.split)
    split = triton.cdiv(groups, per_split)
    out = y if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    if use_mma:
        base32 = w.base.view(torch.int32)
        qgemv_mma.launch_mma(
            x2, w, base32, _high_plane(w, fmt, base32), out, fmt, m, n, k, groups, per_split, split,
            cfg.mma_tiles, cfg.num_warps, cfg.gps, pdl.launch(x2),
        )  # fmt: skip
    else:
        _launch_general(x2, w, out, cfg, fmt, m, n, k, groups, per_split, split)
    if split > 1:
        block = 1024
        _split_sum_kernel[(triton.cdiv(m * n, block),)](out, y, m * n, SPLIT=split, BLOCK=block, num_warps=4, **pdl.launch(x2))
    return y.view(*lead, n)


def _high_plane(w: QuantWeight, fmt: int, base32: torch.Tensor) -> torch.Tensor:
    """The high-bit plane as the word kernels read it: a byte a word (Q5), a halfword a word (Q6);
    the base plane stands in when the format has none (never read)."""
    if w.high is None:
        return base32
    return w.high.view(torch.int16) if fmt == 2 else w.high


def _launch_general(
    x2: torch.Tensor, w: QuantWeight, out: torch.Tensor, cfg: QGemvConfig, fmt: int,
    m: int, n: int, k: int, groups: int, per_split: int, split: int,
) -> None:  # fmt: skip
    """The Triton kernels for every format: one row on the CUDA cores, or M rows (`_launch_rows`)."""
    high = high_words(w)
    if m == 1 and not cfg.use_dot:
        _qgemv_row_kernel[(triton.cdiv(n, cfg.block_n), split)](
            x2, w.base, high, w.scale, out, n, k, groups, per_split,
            w.base.stride(0), high.stride(0), w.scale.stride(0), 0 if split == 1 else n,
            FMT=fmt, BLOCK_N=cfg.block_n, GPS=cfg.gps, PARITY=cfg.parity, MAGIC=cfg.magic,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl.launch(x2),
        )  # fmt: skip
    else:
        _launch_rows(x2, w, out, cfg, fmt, m, n, k, groups, per_split, split, high)


def _launch_rows(
    x2: torch.Tensor, w: QuantWeight, out: torch.Tensor, cfg: QGemvConfig, fmt: int,
    m: int, n: int, k: int, groups: int, per_split: int, split: int, high: torch.Tensor,
) -> None:  # fmt: skip
    """The general kernel: M rows on the CUDA cores (one or two) or the tensor cores."""
    _qgemv_kernel[(triton.cdiv(n, cfg.block_n), split)](
        x2, w.base, high, w.scale, out,
        m, n, k, groups, per_split,
        x2.stride(0), w.base.stride(0), high.stride(0), w.scale.stride(0), 0 if split == 1 else m * n, n,
        FMT=fmt, XDT=_DTYPES.index(x2.dtype), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GPS=cfg.gps,
        PARITY=cfg.parity, USE_DOT=cfg.use_dot, MAGIC=cfg.magic,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl.launch(x2),
    )  # fmt: skip


def _launch_words(x2: torch.Tensor, w: QuantWeight, y: torch.Tensor, cfg: QGemvConfig, fmt: int, n: int, k: int) -> None:
    """One row of a groupwise format through `qgemv_lanes` (GPU, `thread_rows` set) or `qgemv_words`
    (the base plane read as int32 words)."""
    base = w.base
    if base.stride(-1) != 1 or base.storage_offset() % 4 or base.stride(0) % 4:
        raise ValueError("the base plane of a word-read weight must be 4-byte aligned rows")
    base32 = base.view(torch.int32)
    rw = row_words(fmt, w.base.shape[1] * (2 if fmt < 3 else 1))
    bkw = chunk_words(cfg.words, rw)
    chunks = rw // bkw
    per_split = triton.cdiv(chunks, max(1, min(cfg.split, chunks)))
    split = triton.cdiv(chunks, per_split)
    high = _high_plane(w, fmt, base32)
    out = y if split == 1 else torch.empty((split, 1, n), dtype=torch.float32, device=x2.device)
    if cfg.thread_rows and x2.is_cuda and not _INTERPRET:
        launch_lanes(x2, w, base32, high, out, fmt, n, k, bkw, cfg.thread_rows, cfg.num_warps, split, pdl.launch(x2))
    else:
        qgemv_words_kernel[(triton.cdiv(n, cfg.block_n), split)](
            x2, base32, high, w.scale, out, n, k, chunks, per_split,
            base32.stride(0), high.stride(0), w.scale.stride(0), 0 if split == 1 else n,
            FMT=fmt, BLOCK_N=cfg.block_n, BKW=bkw,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl.launch(x2),
        )  # fmt: skip
    if split > 1:
        _split_sum_kernel[(triton.cdiv(n, 1024),)](out, y, n, SPLIT=split, BLOCK=1024, num_warps=4, **pdl.launch(x2))
