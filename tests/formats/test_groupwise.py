"""The groupwise encoder and planes against a bit-level oracle written from the format's rules.

The oracle is scalar Python: binary32 rounding through `struct` ('f': a double rounded to the
nearest binary32, ties to even; exact for one product or quotient of binary32 values, which fit a
double), binary16 through struct 'e' (ties to even; overflow raises). It shares no code with
`ninfer.formats.groupwise`."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from ninfer.formats import groupwise
from ninfer.formats.registry import FORMATS, Q4, Q5, Q6, W8
from ninfer.formats.weight import QuantWeight, cat_rows, quantize

GROUPWISE = [Q4, Q5, Q6, W8]


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f16(x: float) -> float:
    return struct.unpack("<e", struct.pack("<e", x))[0]


def oracle_group(values: list[float], qmin: int, qmax: int) -> tuple[float, list[int]]:
    """MAXABS_F16_RECIP_RNE_V1 for one group of binary32 values: (scale as a float, codes)."""
    amax = max(abs(v) for v in values)
    if amax == 0:
        return 0.0, [0] * len(values)
    raw = f32(amax / float(qmax))
    scale = f16(raw)  # OverflowError when it does not fit fp16
    if scale == 0:
        scale = 2.0**-24
    inv = f32(1.0 / scale)
    codes = []
    for v in values:
        norm = f32(v * inv)
        r = round(norm)  # Python rounds half to even
        codes.append(min(max(r, qmin), qmax))
    return scale, codes


def oracle(x: torch.Tensor, fmt) -> tuple[list[list[float]], list[list[int]]]:
    rows = x.to(torch.float32).tolist()
    scales, codes = [], []
    for row in rows:
        s_row, c_row = [], []
        for g0 in range(0, len(row), fmt.group):
            s, c = oracle_group(row[g0 : g0 + fmt.group], fmt.qmin, fmt.qmax)
            s_row.append(s)
            c_row += c
        scales.append(s_row)
        codes.append(c_row)
    return scales, codes


def hard_matrix(rows: int, k: int, fmt, seed: int) -> torch.Tensor:
    """Random rows plus the boundaries: exact ties, negative ties, tiny groups needing the
    subnormal rescue, all-zero groups and a partial last group (k not a multiple of the group)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen) * torch.logspace(-3, 2, rows).unsqueeze(1)
    g = fmt.group
    # row 0: codes land exactly on .5 steps: amax = qmax * s with s a power of two
    x[0] = (torch.randint(-2 * fmt.qmax, 2 * fmt.qmax + 1, (k,), generator=gen) / 2.0) * 2.0**-3
    x[0, 0] = fmt.qmax * 2.0**-3
    x[1] = x[0] * -1.0
    x[2, :g] = 1e-9  # raw scale underflows fp16: rescued to 2^-24
    x[2, g : 2 * g] = 0.0  # an all-zero group
    x[3] = x[3].to(torch.bfloat16).to(torch.float32)  # bf16 source values
    return x


@pytest.mark.parametrize("fmt", GROUPWISE, ids=lambda f: f.name)
def test_encoder_equals_the_bit_level_oracle(fmt) -> None:
    for seed, (rows, k) in enumerate([(8, 3 * fmt.group + 17), (5, 128), (6, 2 * fmt.group)]):
        x = hard_matrix(rows, k, fmt, seed)
        codes, scales = groupwise.encode(x, fmt)
        want_s, want_c = oracle(x, fmt)
        assert codes.tolist() == want_c
        assert scales.to(torch.float32).tolist() == want_s
        assert scales.dtype == torch.float16


def test_w8_never_emits_minus_128_and_ties_round_to_even() -> None:
    x = torch.tensor([[127.0, -127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5] + [0.0] * 24])
    codes, scales = groupwise.encode(x, W8)
    assert float(scales[0, 0]) == 1.0
    assert codes[0, :8].tolist() == [127, -127, 0, 0, 2, -2, 2, -2]
    big = torch.full((1, 32), -1000.0)
    assert int(groupwise.encode(big, W8)[0].min()) == -127


def test_non_finite_and_overflowing_groups_fail() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        x = torch.zeros(1, 64)
        x[0, 5] = bad
        with pytest.raises(groupwise.FormatError, match="non-finite"):
            groupwise.encode(x, Q4)
    with pytest.raises(groupwise.FormatError, match="overflows"):
        groupwise.encode(torch.full((1, 64), 1e6), Q4)  # 1e6 / 7 > fp16 max


def lane_bits(codes: list[int], bits: int) -> list[int]:
    return [c & ((1 << bits) - 1) for c in codes]


@pytest.mark.parametrize("fmt", GROUPWISE, ids=lambda f: f.name)
def test_planes_follow_the_row_split_layout(fmt) -> None:
    """Every byte of every plane, from the layout's rules, for a partial-K matrix."""
    k = 130 if fmt.group == 64 else 70
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(fmt.qmin, fmt.qmax + 1, (2, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(2, -(-k // fmt.group), generator=gen).to(torch.float16) + 0.5
    base, high, scale = groupwise.pack(codes, scales, fmt)
    kp = 256 if fmt.group == 64 else 128
    for r in range(2):
        u = lane_bits(codes[r].tolist(), fmt.bits) + [0] * (kp - k)  # padding lanes: code 0
        if fmt.bits == 8:
            assert base[r].tolist() == u
        else:
            assert base[r].tolist() == [(u[2 * j] & 15) | ((u[2 * j + 1] & 15) << 4) for j in range(kp // 2)]
        if fmt.high_bits:
            stream = []
            for lane in u:
                stream += [(lane >> (4 + b)) & 1 for b in range(fmt.high_bits)]
            want = [sum(stream[8 * i + t] << t for t in range(8)) for i in range(len(stream) // 8)]
            assert high is not None and high[r].tolist() == want
        else:
            assert high is None
        logical = scales[r].tolist()
        assert scale[r].tolist() == logical + [0.0] * (kp // fmt.group - len(logical))
    assert groupwise.unpack(base, high, fmt)[:, :k].tolist() == codes.tolist()


def test_the_documented_q5_example_geometry() -> None:
    """Q5 [2, 130]: Kp 256, four groups a row: base 256, high 64, scale 16 bytes."""
    q = quantize(torch.randn(2, 130), "q5_g64")
    assert (q.base.numel(), q.high.numel(), q.scale.numel() * 2) == (256, 64, 16)


@pytest.mark.parametrize("name", list(FORMATS))
def test_dequantize_is_scale_times_code(name) -> None:
    w = torch.randn(256 + 3, 300) * 0.02
    q = quantize(w, name)
    d = q.dequantize()
    if q.fmt.kind == "groupwise":
        codes = groupwise.unpack(q.base, q.high, q.fmt).to(torch.float32)[:, :300]
        s = q.scale.to(torch.float32).repeat_interleave(q.fmt.group, 1)[:, :300]
        assert torch.equal(d, codes * s)
    rel = float((d - w).norm() / w.norm())
    assert rel < {"q4_g64": 0.13, "q5_g64": 0.06, "q6_g64": 0.03, "q8_g32": 0.008}.get(name, 0.04)


def test_fused_rows_and_experts_are_the_parts() -> None:
    a, b = quantize(torch.randn(64, 192), "q6_g64"), quantize(torch.randn(32, 192), "q6_g64")
    both = cat_rows([a, b])
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    bank = torch.randn(3, 128, 256)
    for name in ("q4_g64", "fp8_e4m3_b128"):
        qb = quantize(bank, name)
        for e in range(3):
            assert torch.equal(qb.expert(e).dequantize(), quantize(bank[e], name).dequantize())
    idx = torch.tensor([5, 0, 31])
    assert torch.equal(b.select_rows(idx).dequantize(), b.dequantize()[idx])
    assert torch.equal(b.dequantize_rows(idx.view(1, 3), torch.float32)[0], b.dequantize()[idx])


def test_planes_of_the_wrong_shape_are_refused() -> None:
    q = quantize(torch.randn(4, 64), "q5_g64")
    with pytest.raises(groupwise.FormatError, match="planes"):
        QuantWeight(q.fmt, (4, 64), q.base[:3], q.high, q.scale)
