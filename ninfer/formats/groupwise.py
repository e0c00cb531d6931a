"""Groupwise integer formats: the canonical encoder (MAXABS_F16_RECIP_RNE_V1), the row-split-k128
planes and their reference decoder.

Encoder, per row and per group of G lanes along K (G = 64 for Q4 / Q5 / Q6, 32 for W8), all in
IEEE binary32 / binary16 with round-half-even (torch's CPU arithmetic):
    amax  = max |x|                       (x converted to fp32)
    scale = fp16(amax / qmax)             (qmax = 7 / 15 / 31 / 127; an underflow to 0 is raised
                                           to the smallest fp16 subnormal 2^-24; overflow fails)
    inv   = fp32(1 / fp32(scale))
    code  = clamp(round_half_even(fp32(x * inv)), qmin, qmax)
An all-zero group gets scale +0 and codes 0; non-finite input fails. Dequantized weight =
fp32(scale) * code.

Planes of a [R, K] matrix (K padded to Kp = a multiple of 128 with zero codes; whole padding
groups get scale 0), every plane row-major over its rows, a row's groups contiguous:
    base  uint8 [R, Kp / 2]  Q4 / Q5 / Q6: lane 2j in the low nibble of byte j, lane 2j + 1 in the
                             high nibble (the low 4 bits of the code's two's-complement word)
          uint8 [R, Kp]      W8: the code's int8 byte
    high  uint8 [R, Kp / 8]  Q5: bit 4 of lane k is bit k % 8 of byte k // 8
          uint8 [R, Kp / 4]  Q6: bits 4, 5 of lane k are bits 2 (k % 4), 2 (k % 4) + 1 of byte k // 4
    scale fp16  [R, Kp / G]
"""

from __future__ import annotations

import torch

from ninfer.formats.registry import PlaneShapeError, WeightFormat, padded_k

_MIN_SUBNORMAL = 2.0**-24  # the smallest positive fp16 (bits 0x0001)
ENCODE_ROWS = 4096  # rows encoded at once (bounds the fp32 working copy of large matrices)


class FormatError(PlaneShapeError):
    """A tensor cannot be encoded in (or decoded from) a format: non-finite input, scale overflow,
    mis-shaped planes."""


def encode(x: torch.Tensor, fmt: WeightFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, K] (any float dtype) -> (codes int8 [R, K], scales fp16 [R, ceil(K / G)])."""
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise FormatError(f"groupwise encoding takes a non-empty [R, K] matrix; got {tuple(x.shape)}")
    codes, scales = [], []
    for lo in range(0, x.shape[0], ENCODE_ROWS):
        c, s = _encode_rows(x[lo : lo + ENCODE_ROWS].to(torch.float32), fmt)
        codes.append(c)
        scales.append(s)
    return torch.cat(codes), torch.cat(scales)


def _encode_rows(x: torch.Tensor, fmt: WeightFormat) -> tuple[torch.Tensor, torch.Tensor]:
    if not bool(torch.isfinite(x).all()):
        raise FormatError("cannot quantize non-finite values (NaN or infinity)")
    r, k = x.shape
    g = fmt.group
    groups = -(-k // g)
    xg = torch.nn.functional.pad(x, (0, groups * g - k)).view(r, groups, g)  # zero padding: amax unchanged
    amax = xg.abs().amax(dim=-1)  # [R, groups] fp32
    scale16 = (amax / float(fmt.qmax)).to(torch.float16)  # fp32 division, then RNE to fp16
    if bool(torch.isinf(scale16).any()):
        raise FormatError(f"a group's scale overflows fp16 in {fmt.name} (max |x| {float(amax.max()):.6g})")
    rescue = (scale16 == 0) & (amax > 0)
    scale16 = torch.where(rescue, torch.tensor(_MIN_SUBNORMAL, dtype=torch.float16, device=x.device), scale16)
    scale32 = scale16.to(torch.float32)
    nonzero = amax > 0
    inv = torch.where(nonzero, torch.ones_like(scale32) / torch.where(nonzero, scale32, 1.0), 0.0)
    q = torch.round(xg * inv[..., None]).clamp_(fmt.qmin, fmt.qmax)  # half-to-even, then clamp
    return q.view(r, groups * g)[:, :k].to(torch.int8), scale16


def pack(
    codes: torch.Tensor, scales: torch.Tensor, fmt: WeightFormat
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Logical codes int8 [R, K] and scales fp16 [R, ceil(K / G)] -> (base, high or None, scale) planes."""
    r, k = codes.shape
    kp = padded_k(k)
    full = torch.zeros(r, kp, dtype=torch.int16, device=codes.device)
    full[:, :k] = codes.to(torch.int16)
    scale = torch.zeros(r, kp // fmt.group, dtype=torch.float16, device=codes.device)
    scale[:, : scales.shape[1]] = scales
    if fmt.bits == 8:
        return full.to(torch.int8).view(torch.uint8).contiguous(), None, scale
    u = full & ((1 << fmt.bits) - 1)  # the two's-complement word, [R, Kp]
    low = (u & 0xF).view(r, kp // 2, 2)
    base = (low[..., 0] | (low[..., 1] << 4)).to(torch.uint8)
    if fmt.high_bits == 0:
        return base.contiguous(), None, scale
    hb = u >> 4
    if fmt.high_bits == 1:
        lanes = hb.view(r, kp // 8, 8) << torch.arange(8, dtype=torch.int16, device=hb.device)
    else:
        lanes = hb.view(r, kp // 4, 4) << (2 * torch.arange(4, dtype=torch.int16, device=hb.device))
    high = lanes.sum(dim=-1).to(torch.uint8)
    return base.contiguous(), high.contiguous(), scale


def unpack(base: torch.Tensor, high: torch.Tensor | None, fmt: WeightFormat) -> torch.Tensor:
    """Planes -> signed codes int8 [R, Kp] (padding lanes included)."""
    r = base.shape[0]
    if fmt.bits == 8:
        return base.view(torch.int8)
    if (high is None) != (fmt.high_bits == 0):
        raise FormatError(f"{fmt.name}: high-bit plane {'missing' if high is None else 'unexpected'}")
    b = base.to(torch.int16)
    u = torch.stack([b & 0xF, b >> 4], dim=-1).view(r, -1)  # [R, Kp] low nibbles
    if high is not None:
        h = high.to(torch.int16)
        if fmt.high_bits == 1:
            hb = (h[..., None] >> torch.arange(8, dtype=torch.int16, device=h.device)) & 1
        else:
            hb = (h[..., None] >> (2 * torch.arange(4, dtype=torch.int16, device=h.device))) & 3
        u = u | (hb.reshape(r, -1) << 4)
    return (u - ((u & fmt.sign) << 1)).to(torch.int8)


def dequantize(
    base: torch.Tensor, high: torch.Tensor | None, scale: torch.Tensor, fmt: WeightFormat, k: int
) -> torch.Tensor:
    """Planes -> fp32 [R, K]: fp32(scale) * code per lane (the format's reconstruction)."""
    codes = unpack(base, high, fmt).to(torch.float32)  # [R, Kp]
    s = scale.to(torch.float32).repeat_interleave(fmt.group, dim=1)  # [R, Kp]
    return (codes * s)[:, :k]
