"""Every Triton kernel variant the model launches compiles for the H200 (sm_90) and fits its resources.

The interpreter accepts programs the GPU compiler rejects (tl.dot below 16 rows, mismatched
dtypes, too much shared memory, spills), so the launches are recorded (`sm90_compile.Recorder`):
small calls that run in the interpreter (bf16 and fp32), and the real 27B / 35B-A3B widths as
meta-tensor calls of the same wrappers (signature only), then each distinct variant is built by
ptxas for sm_90 and checked: compiles, shared memory <= 232448 B, no spills.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import importlib
import importlib.util
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # ops.bench: the benchmarked shapes
from sm90_compile import MAX_SHARED, CompileResult, Recorder, compile_variants, ptxas_path

from ninfer.formats.registry import format_of, plane_shapes
from ninfer.formats.weight import QuantWeight, quantize
from ninfer.kernels.triton import dequant, gates, gdn_decode, gemv, kv_write, moe, norms, qgemv
from ninfer.kernels.triton.conv_step import conv_step
from ninfer.model.config import TextConfig
from ops.bench.gemv_micro import projections
from ops.bench.shapes import SHAPES

pa = importlib.import_module(
    "ninfer.kernels.triton.paged_attention"
)  # the package exports a function of that name

pytestmark = [
    pytest.mark.skipif(
        ptxas_path() is None, reason="the triton wheel ships no ptxas (triton/backends/nvidia/bin/ptxas)"
    ),
    # the recorder runs the small calls in the interpreter; with TRITON_INTERPRET=0 (a GPU run of the
    # kernel tests) every other test in this folder launches the compiled kernels themselves
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1",
        reason="records launches through the Triton interpreter (TRITON_INTERPRET=1); compiled runs test the kernels directly",
    ),
]

BF16, FP32 = torch.bfloat16, torch.float32
MODELS = ("qwen3.6-27b", "qwen3.6-35b-a3b")
PHASES = ((1, 1), (8, 1), (1, 4), (8, 4))  # (B, q): decode at B = 1 / 8, verify q = 4 with write slots
PAGE = 64
H200_SMS = 132


def _t(*shape: int, dtype: torch.dtype = BF16, device: str = "cpu") -> torch.Tensor:
    if device == "meta" or not dtype.is_floating_point:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.randn(shape).to(dtype)


def _h200_splits(programs: int, max_pages: int) -> int:
    """The split count `paged_attention` picks on an H200 (its own rule, with 132 SMs)."""
    with mock.patch.object(pa, "_sm_count", lambda device: H200_SMS):
        return pa._auto_splits(torch.device("cuda"), programs, max_pages)


def _attention(b: int, q: int, nh: int, nkv: int, hd: int, dtype: torch.dtype, device: str, *,
               pages: int, splits: int | None, int8: bool) -> None:  # fmt: skip
    """q/k norm + rope, K/V write, paged attention and the output gate of one attention layer."""
    num_pages, rot = b * pages, hd // 4
    qg = _t(b, q, nh, 2 * hd, dtype=dtype, device=device)  # [q | gate] per head, as the model fuses
    kv = _t(b, q, 2 * nkv * hd, dtype=dtype, device=device)
    w, cos = _t(hd, dtype=dtype, device=device), _t(b, q, rot, dtype=dtype, device=device)
    qh = norms.norm_rope(qg[..., :hd], w, 1e-6, cos, cos)
    k = norms.norm_rope(kv[..., : nkv * hd].view(b, q, nkv, hd), w, 1e-6, cos, cos)
    v = kv[..., nkv * hd :].view(b, q, nkv, hd)
    table = torch.randperm(num_pages).to(torch.int32).view(b, pages).to(device)
    lens = torch.full((b,), (pages - 1) * PAGE - q, dtype=torch.int64).to(device)
    scales = {}
    if int8:  # int8 pools are written by torch ops; the attention reads them with per-token scales
        kp = torch.zeros(num_pages, PAGE, nkv, hd, dtype=torch.int8, device=device)
        vp = torch.ones(num_pages, PAGE, nkv, hd, dtype=torch.int8, device=device)
        scales = {
            "k_scale": torch.full(kp.shape[:3], 0.01, device=device),
            "v_scale": torch.full(kp.shape[:3], 0.02, device=device),
        }
    else:
        kp, vp = (
            _t(num_pages, PAGE, nkv, hd, dtype=dtype, device=device),
            _t(num_pages, PAGE, nkv, hd, dtype=dtype, device=device),
        )
        kv_write.write_kv(kp, vp, k, v, table, lens)
    if splits is None:
        splits = _h200_splits(b * nkv * -(-q * (nh // nkv) // 16), pages)
    o = pa.paged_attention(qh, kp, vp, table, lens, num_splits=splits, **scales)
    gates.sigmoid_gate(o, qg[..., hd:])


def _gdn(b: int, q: int, nk: int, nv: int, dk: int, dv: int, dtype: torch.dtype, device: str, *,
         norm_dtype: torch.dtype) -> None:  # fmt: skip
    """conv step, GDN step (fused gating and precomputed gates) and the gated output norm of one layer."""
    kd, vd = nk * dk, nv * dv
    proj = _t(b, q, 2 * kd + 2 * vd + 2 * nv, dtype=dtype, device=device)  # fused qkv | z | b | a
    qkv, z = proj[..., : 2 * kd + vd], proj[..., 2 * kd + vd : 2 * kd + 2 * vd]
    braw, araw = proj[..., -2 * nv : -nv], proj[..., -nv:]
    weight = _t(2 * kd + vd, 4, dtype=dtype, device=device)
    writes = torch.arange(b * q, dtype=torch.int64).view(b, q).to(device)
    start = torch.arange(b, dtype=torch.int64).to(device)
    conv_pool = _t(b * q, 2 * kd + vd, 3, dtype=dtype, device=device)
    x = conv_step(qkv, weight, conv_pool, writes, start)
    qh, kh = x[..., :kd].reshape(b, q, nk, dk), x[..., kd : 2 * kd].reshape(b, q, nk, dk)
    vh = x[..., 2 * kd :].reshape(b, q, nv, dv)
    ssm = torch.zeros(b * q, nv, dk, dv, dtype=FP32, device=device)
    a_log, dt_bias = _t(nv, dtype=FP32, device=device), _t(nv, dtype=FP32, device=device)
    o = gdn_decode.gdn_decode_step(qh, kh, vh, araw, braw, a_log, dt_bias, ssm, writes, start)
    g = -torch.rand(b, q, nv, device=device).to(dtype) if device != "meta" else braw
    gdn_decode.gdn_step_gated(qh, kh, vh, g, braw.sigmoid() if device != "meta" else braw, ssm, writes, start)
    norms.gated_rms_norm(o, z.view(b, q, nv, dv), _t(dv, dtype=norm_dtype, device=device), 1e-6)


def _ffn_and_norms(n: int, h: int, inter: int, dtype: torch.dtype, device: str) -> None:
    x = _t(n, h, dtype=dtype, device=device)
    w = _t(h, dtype=dtype, device=device)
    norms.rms_norm(x, w, 1e-6)
    norms.add_rms_norm(x, x, w, 1e-6)
    gu = _t(n, 2 * inter, dtype=dtype, device=device)
    gates.silu_mul(gu[:, :inter], gu[:, inter:])


def _moe(n: int, e: int, top: int, h: int, ie: int, dtype: torch.dtype, device: str) -> None:
    logits = _t(n, e + 1, dtype=dtype, device=device)  # router | shared-expert gate, fused
    idx, w = moe.moe_route(logits[:, :e], top)
    if device == "meta":
        idx = torch.zeros(n, top, dtype=torch.int64, device=device)
    x = _t(n, h, dtype=dtype, device=device)
    routed = moe.moe_experts_small(
        x, _t(e, 2 * ie, h, dtype=dtype, device=device), _t(e, h, ie, dtype=dtype, device=device), idx, w
    )
    gates.shared_expert_add(routed, logits[:, e:], x)


def _gemv(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    device: str,
    num_sms: int = gemv.NUM_SMS,
    act: str | None = None,
) -> gemv.GemvConfig:
    """One GEMV launch; act "swiglu": x is gate | up [m, 2k] (the MLP down projection's fused form)."""
    cfg = gemv.pick_config(m, n, k, dtype, num_sms, act=act)
    width = k if act is None else 2 * k
    gemv.gemv(_t(m, width, dtype=dtype, device=device), _t(n, k, dtype=dtype, device=device), cfg, act=act)
    return cfg


def _meta_weight(fmt: str, shape: tuple[int, ...]) -> QuantWeight:
    """A quantized weight of `shape` with meta planes (real widths, nothing stored)."""
    f = format_of(fmt)
    dtypes = {"base": torch.uint8, "high": torch.uint8, "scale": torch.float16}
    if f.kind == "fp8":
        dtypes = {"base": torch.float8_e4m3fn, "scale": torch.float32}
    planes = {p: torch.empty(sh, dtype=dtypes[p], device="meta") for p, sh in plane_shapes(shape, f).items()}
    return QuantWeight(f, shape, planes["base"], planes.get("high"), planes["scale"])


# the quantized decode projections of the 27B groupwise-int / fp8 and 35B-A3B groupwise-int steps
QUANT_PROJECTIONS = (
    ("q4_g64", 7168, 5120), ("q5_g64", 7168, 5120), ("q5_g64", 5120, 6144), ("q4_g64", 4096, 5120),
    ("q5_g64", 12288, 5120), ("q4_g64", 34816, 5120), ("q5_g64", 5120, 17408), ("q6_g64", 248320, 5120),
    ("fp8_e4m3_b128", 14336, 5120), ("fp8_e4m3_b128", 5120, 17408), ("fp8_e4m3_b128", 248320, 5120),
    ("q8_g32", 9216, 2048), ("q8_g32", 2048, 4096), ("q8_g32", 1024, 2048), ("q6_g64", 248320, 2048),
)  # fmt: skip


def quantized_launches(rec: Recorder) -> None:
    """The quantized GEMV, MoE experts and dequantization: small calls in the interpreter (bf16, every
    format and lane layout), then the real widths (bf16) with the heuristic's configs and every config
    the measured table names."""
    import dataclasses
    import json

    torch.manual_seed(0)
    for dtype in (BF16,):  # fp32 (tests only) runs the same code at other tile sizes: test_qgemv.py
        with rec.scenario(f"quantized interpreter {dtype}"):
            for fmt in ("q4_g64", "q5_g64", "q6_g64", "q8_g32", "fp8_e4m3_b128"):
                w = quantize(torch.randn(40, 200) * 0.1, fmt)
                for m in (1, 3):
                    x = torch.randn(m, 200).to(dtype)
                    base = qgemv.pick_config(m, 40, w.scale.shape[1], fmt, dtype, k=200)
                    for parity in (False, True) if fmt < "q8" else (False,):
                        qgemv.qgemv(x, w, dataclasses.replace(base, parity=parity, split=2))
                dequant.dequantize(w, dtype)
                gate_up, down = quantize(torch.randn(4, 64, 96) * 0.1, fmt), quantize(torch.randn(4, 96, 32) * 0.1, fmt)
                idx = torch.tensor([[0, 1], [1, 2]])
                moe.moe_experts_small_quantized(torch.randn(2, 96).to(dtype), gate_up, down, idx, torch.rand(2, 2).to(dtype))
    table = json.loads(qgemv.TABLE_FILE.read_text())["configs"] if qgemv.TABLE_FILE.is_file() else {}
    with rec.scenario(f"quantized real widths {BF16}"):
        for fmt, n, k in QUANT_PROJECTIONS:
            w = _meta_weight(fmt, (n, k))
            groups = w.scale.shape[1]
            for m in (1, 8):
                x = torch.empty(m, k, dtype=BF16, device="meta")
                qgemv.qgemv(x, w, qgemv.pick_config(m, n, groups, fmt, BF16, k=k))
                entry = table.get(qgemv.table_key(fmt, n, k, m))
                # a table entry for the Gluon tensor-core kernel (`mma_tiles`) launches no Triton kernel
                # at the rows it is measured for (`test_gluon_sm90.py` builds it); elsewhere the heuristic
                if entry is not None and m in (1, 8) and not entry.get("mma_tiles"):
                    qgemv.qgemv(x, w, qgemv.QGemvConfig(**entry))
                if m == 1 and fmt != "fp8_e4m3_b128":  # the word kernel's swept tiles
                    for words, bn, warps in ((32, 32, 4), (64, 32, 4), (32, 64, 8), (64, 64, 8), (128, 16, 4)):
                        qgemv.qgemv(x, w, qgemv.QGemvConfig(1, bn, 2, warps, 2, False, True, 1, words=words))
        for fmt_in, fmt_down in (("q4_g64", "q5_g64"), ("q4_g64", "q6_g64"), ("q8_g32", "q8_g32")):
            e, h, ie = 256, 2048, 512
            gate_up, down = _meta_weight(fmt_in, (e, 2 * ie, h)), _meta_weight(fmt_down, (e, h, ie))
            for n in (1, 8):
                idx = torch.zeros(n, 8, dtype=torch.int64, device="meta")
                x = torch.empty(n, h, dtype=BF16, device="meta")
                moe.moe_experts_small_quantized(x, gate_up, down, idx, torch.empty(n, 8, dtype=BF16, device="meta"))
        for fmt, n, k in (("q4_g64", 34816, 5120), ("q5_g64", 5120, 17408), ("fp8_e4m3_b128", 34816, 5120)):
            dequant.dequantize(_meta_weight(fmt, (n, k)), BF16)


def interpreter_launches(rec: Recorder) -> None:
    """Small calls that run in the interpreter (CPU tensors): every wrapper in bf16 and fp32."""
    torch.manual_seed(0)
    for dtype in (BF16, FP32):
        with rec.scenario(f"interpreter {dtype}"):
            for b, q in ((1, 1), (2, 4)):
                _gdn(b, q, 2, 4, 16, 16, dtype, "cpu", norm_dtype=FP32)
                _ffn_and_norms(b * q, 64, 48, dtype, "cpu")
                _moe(b * q, 8, 2, 64, 32, dtype, "cpu")
            for hd, nh, nkv, int8, splits in ((256, 6, 1, False, 1), (128, 16, 2, True, 2)):
                _attention(1, 1, nh, nkv, hd, dtype, "cpu", pages=2, splits=splits, int8=int8)
            for m, n, k in ((1, 64, 256), (8, 64, 256), (1, 32, 4096), (8, 32, 2048)):
                for act in (None, "swiglu"):  # one SM: single-pass at n = 64, split-K below
                    _gemv(m, n, k, dtype, "cpu", num_sms=1, act=act)


def real_width_launches(rec: Recorder) -> dict[str, set[int]]:
    """The model's launches at the released widths (meta tensors: signatures only). Returns the
    GEMV split counts seen per dtype (the dispatch takes single-pass and split-K configs)."""
    splits: dict[str, set[int]] = {}
    for name in MODELS:
        cfg = TextConfig.from_hf(SHAPES[name])
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        for dtype in (BF16, FP32):
            full = dtype == BF16  # fp32 (tests, not served): one decode and one verify shape
            phases = PHASES if full else ((1, 1), (8, 4))
            with rec.scenario(f"{name} {dtype}"):
                for b, q in (*phases, (1, 40), (2, 24)) if full else phases:  # + prefill-size Triton calls
                    _attention(b, q, nh, nkv, hd, dtype, "meta", pages=64, splits=None, int8=False)
                    if full:
                        _attention(b, q, nh, nkv, hd, dtype, "meta", pages=64, splits=None, int8=True)
                        _attention(b, q, nh, nkv, hd, dtype, "meta", pages=64, splits=1, int8=False)
                        _attention(
                            b, q, 2 * nh, 2 * nkv, hd // 2, dtype, "meta", pages=64, splits=None, int8=False
                        )
                for b, q in phases:
                    for norm_dtype in {dtype, FP32}:
                        _gdn(b, q, cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                             cfg.linear_value_head_dim, dtype, "meta", norm_dtype=norm_dtype)  # fmt: skip
                    inter = cfg.shared_expert_intermediate_size if cfg.num_experts else cfg.intermediate_size
                    _ffn_and_norms(b * q, cfg.hidden_size, inter, dtype, "meta")
                if cfg.num_experts:
                    for n in (1, 8, 48):
                        _moe(n, cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size,
                             cfg.moe_intermediate_size, dtype, "meta")  # fmt: skip
                for p in projections(cfg):
                    # the MLP's down projection also runs with the SwiGLU folded in (`Ops.swiglu_linear`)
                    acts = (None, "swiglu") if p.name.endswith("down_proj") else (None,)
                    for m in (1, 2, 4, 8, 16):
                        if gemv.gemv_wins(m, p.n, p.k):
                            for act in acts:
                                cfg_m = _gemv(m, p.n, p.k, dtype, "meta", act=act)
                                splits.setdefault(str(dtype), set()).add(cfg_m.split)
    return splits


@pytest.fixture(scope="module")
def recorded() -> Recorder:
    with Recorder() as rec:
        interpreter_launches(rec)
        rec.gemv_splits = real_width_launches(rec)
        quantized_launches(rec)
    return rec


@pytest.fixture(scope="module")
def compiled(recorded: Recorder) -> list[CompileResult]:
    """Every variant a bf16 call launches. Variants only fp32 calls launch (fp32 models are a test
    configuration, never served on a GPU: a quarter of the variants) are recorded, so their wrappers
    run, but compiled only where they run: the kernel tests on the GPU (TRITON_INTERPRET=0)."""
    return compile_variants([v for v, labels in recorded.variants.items() if not _fp32_only(labels)])


def test_every_package_kernel_was_launched(recorded: Recorder) -> None:
    """Every kernel except helpers that other kernels call (they compile as part of their callers)."""
    src = {key: kernel.fn.__code__ for key, kernel in recorded.kernels.items()}
    helpers = {k for k in src if any(k.rsplit(".", 1)[1] in c.co_names for o, c in src.items() if o != k)}
    assert set(recorded.kernels) - helpers == recorded.launched, sorted(
        set(recorded.kernels) - helpers - recorded.launched
    )


def test_gemv_dispatch_takes_single_pass_and_split_k(recorded: Recorder) -> None:
    for dtype in (BF16, FP32):
        seen = recorded.gemv_splits[str(dtype)]
        assert 1 in seen and max(seen) > 1, (dtype, seen)


def test_gemv_swiglu_variants_are_recorded(recorded: Recorder) -> None:
    """The down projection with the SwiGLU folded in (ACT 1) is built at both models' real widths."""
    labels = set()
    for v, where in recorded.variants.items():
        consts = {v.signature[p[0]][0]: val for p, val in v.constexprs}
        if v.kernel == "_gemv_kernel" and consts.get("ACT") == 1:
            labels.update(where)
    for name in MODELS:
        assert f"{name} {BF16}" in labels, sorted(labels)
    assert f"interpreter {FP32}" in labels, sorted(labels)


def _fp32_only(labels: list[str]) -> bool:
    return all("float32" in label for label in labels)


def test_every_variant_compiles_for_sm90_within_limits(
    recorded: Recorder, compiled: list[CompileResult]
) -> None:
    """Compiles, fits shared memory and registers; no spills."""
    bad = []
    for r in compiled:
        labels = recorded.variants[r.variant]
        problems = r.problems()
        if problems:
            bad.append(f"{r.variant.label()} [{'; '.join(labels[:3])}]: {'; '.join(problems)}")
    assert not bad, "\n".join(bad)
    assert all(r.registers is not None and r.spill_bytes is not None for r in compiled), "no ptxas -v report"


_BROKEN = """
import triton
import triton.language as tl


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(c_ptr + m[:, None] * N + n[None, :], tl.dot(a, b))


@triton.jit
def big_tile_kernel(a_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr):
    m, k = tl.arange(0, M), tl.arange(0, K)
    acc = tl.zeros([M, M], dtype=tl.float32)
    for i in range(0, 4):
        a = tl.load(a_ptr + i * M * K + m[:, None] * K + k[None, :])
        acc = tl.dot(a, tl.trans(a), acc)
    tl.store(c_ptr + m[:, None] * M + m[None, :], acc)
"""


def _broken_module(tmp_path: Path) -> dict:
    path = tmp_path / "broken_kernels.py"
    path.write_text(textwrap.dedent(_BROKEN))
    spec = importlib.util.spec_from_file_location("broken_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {f"{path}.dot_kernel": mod.dot_kernel, f"{path}.big_tile_kernel": mod.big_tile_kernel}


def test_recorder_catches_what_only_the_interpreter_accepts(tmp_path: Path) -> None:
    """A tl.dot over an 8-wide reduction runs in the interpreter but fails for sm_90 (K >= 16); the
    16-wide one compiles; a tile that needs more than 232448 B of shared memory is flagged."""
    kernels = _broken_module(tmp_path)
    dot, big = kernels.values()
    with Recorder(kernels) as rec:
        for k in (8, 16):
            a, b = torch.randn(16, k), torch.randn(k, 16)
            c = torch.empty(16, 16)
            dot[(1,)](a, b, c, M=16, N=16, K=k)  # runs in the interpreter
            torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
        a = torch.empty(4, 128, 256, device="meta")
        big[(1,)](a, torch.empty(128, 128, device="meta"), M=128, K=256, num_stages=4)
    results = compile_variants(list(rec.variants))
    assert len(results) == 3
    eight, sixteen, huge = results
    assert "CompilationError" in eight.error and not sixteen.error, (eight.error, sixteen.error)
    assert eight.problems() and not sixteen.problems()
    assert sixteen.shared <= MAX_SHARED and sixteen.registers and sixteen.spill_bytes == 0
    assert not huge.error and huge.shared > MAX_SHARED, huge
    assert any("shared memory" in p for p in huge.problems())
