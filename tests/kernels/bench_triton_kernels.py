"""GPU timing and real-shape check of the Triton kernels (run by hand on a CUDA machine, not by pytest).

python tests/kernels/bench_triton_kernels.py   # Qwen3.5-27B layer shapes, prints one line per config
"""

from functools import partial

import torch
from triton.testing import do_bench_cudagraph

from ninfer.kernels import attention_ref, conv_ref, gdn_ref
from ninfer.kernels.triton import (
    conv_step,
    gdn_decode_step,
    paged_attention_decode,
    quantize_kv_int8,
)

DEV = "cuda"
NK, NV, DK, DV, CONV = 16, 48, 128, 128, 10240  # 27B GDN
NH, NKV, HD, PAGE = 24, 4, 256, 64  # 27B attention


def _us(fn) -> float:
    """Kernel time in microseconds, replayed from a CUDA graph (no host overhead; checks capturability)."""
    return do_bench_cudagraph(fn) * 1e3


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def bench_gdn() -> None:
    for n, t in ((1, 1), (8, 1), (64, 1), (1, 4), (8, 4)):
        q = torch.randn(n, t, NK, DK, device=DEV, dtype=torch.bfloat16)
        k = torch.randn(n, t, NK, DK, device=DEV, dtype=torch.bfloat16)
        v = torch.randn(n, t, NV, DV, device=DEV, dtype=torch.bfloat16)
        a = torch.randn(n, t, NV, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(n, t, NV, device=DEV, dtype=torch.bfloat16)
        a_log = torch.rand(NV, device=DEV)
        dt_bias = torch.randn(NV, device=DEV)
        pool = torch.randn(n * t + n, NV, DK, DV, device=DEV) * 0.1
        slot_idx = torch.arange(n * t, device=DEV, dtype=torch.int32).reshape(n, t)
        start = torch.arange(n * t, n * t + n, device=DEV, dtype=torch.int32)
        h0 = pool[start.long()].clone()
        o = gdn_decode_step(q, k, v, a, b, a_log, dt_bias, pool, slot_idx, start)
        g = -a_log.exp() * torch.nn.functional.softplus(a.float() + dt_bias)
        ref_o, ref_s = gdn_ref.recurrent_gated_delta_rule(q, k, v, g, torch.sigmoid(b.float()), h0)
        err = (_rel(o, ref_o), _rel(pool[slot_idx[:, -1].long()], ref_s))
        for bv, warps in ((None, None), (8, 1), (16, 2), (32, 4)):
            us = _us(
                partial(
                    gdn_decode_step,
                    q,
                    k,
                    v,
                    a,
                    b,
                    a_log,
                    dt_bias,
                    pool,
                    slot_idx,
                    start,
                    block_v=bv,
                    num_warps=warps,
                )
            )
            kb = n * (1 + t) * NV * DK * DV * 4 / 1e3
            print(
                f"gdn N={n} T={t} BV={bv} warps={warps}: {us:.1f} us, state {kb / us:.2f} GB/s, rel err o/state {err[0]:.1e}/{err[1]:.1e}"
            )


def bench_conv() -> None:
    for n, t in ((1, 1), (64, 1), (8, 4)):
        x = torch.randn(n, t, CONV, device=DEV, dtype=torch.bfloat16)
        w = torch.randn(CONV, 4, device=DEV, dtype=torch.bfloat16)
        pool = torch.randn(n, CONV, 3, device=DEV, dtype=torch.bfloat16)
        st = pool.clone()
        slots = torch.arange(n, device=DEV)
        write = slots[:, None].expand(n, t).contiguous()  # every token's window into the same slot
        y = conv_step(x, w, pool, write, slots)
        ry, rs = conv_ref.causal_conv1d_with_state(x, w, st)
        err = (_rel(y, ry), bool(torch.equal(pool, rs)))
        for bc in (None, 128, 512):
            us = _us(partial(conv_step, x, w, pool, write, slots, block_c=bc))
            print(f"conv N={n} T={t} BC={bc}: {us:.1f} us, rel err {err[0]:.1e}, state exact {err[1]}")


def bench_attention() -> None:
    for n, length in ((1, 8192), (8, 8192), (1, 65536)):
        pages = (length + PAGE - 1) // PAGE
        k_pool = torch.randn(n * pages, PAGE, NKV, HD, device=DEV, dtype=torch.bfloat16)
        v_pool = torch.randn(n * pages, PAGE, NKV, HD, device=DEV, dtype=torch.bfloat16)
        pt = torch.randperm(n * pages, device=DEV).reshape(n, pages).to(torch.int32)
        q = torch.randn(n, NH, HD, device=DEV, dtype=torch.bfloat16)
        lens = torch.full((n,), length, device=DEV, dtype=torch.int32)
        kq, ks = quantize_kv_int8(k_pool)
        vq, vs = quantize_kv_int8(v_pool)
        ref = attention_ref.paged_attention(q[:, None], k_pool, v_pool, pt, lens.long() - 1, HD**-0.5)[:, 0]
        kb = n * length * NKV * HD * 2 * 2 / 1e3
        for splits in (None, 1, 16, 64):
            o = paged_attention_decode(q, k_pool, v_pool, pt, lens, num_splits=splits)
            us = _us(partial(paged_attention_decode, q, k_pool, v_pool, pt, lens, num_splits=splits))
            print(
                f"attn bf16 N={n} L={length} splits={splits}: {us:.1f} us, KV {kb / us:.2f} GB/s, rel err {_rel(o, ref):.1e}"
            )
            o8 = paged_attention_decode(q, kq, vq, pt, lens, k_scale=ks, v_scale=vs, num_splits=splits)
            us = _us(
                partial(
                    paged_attention_decode, q, kq, vq, pt, lens, k_scale=ks, v_scale=vs, num_splits=splits
                )
            )
            print(
                f"attn int8 N={n} L={length} splits={splits}: {us:.1f} us, KV {kb / 2 / us:.2f} GB/s, rel err {_rel(o8, ref):.1e}"
            )


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__)
    bench_gdn()
    bench_conv()
    bench_attention()
