"""The closed registry of weight formats: names, code widths, group geometry, plane sizes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

K_ALIGN = 128  # row-split-k128: K padded to a multiple of 128 (padding groups: scale 0, codes 0)
FP8_BLOCK = 128  # fp8: one fp32 scale per 128 x 128 block (Qwen's FP8 checkpoints)
FP8_MAX = 448.0  # largest finite e4m3fn value
PLANE_SEP = "#"  # an artifact stores a quantized tensor NAME as NAME#base, NAME#high, NAME#scale


@dataclass(frozen=True)
class WeightFormat:
    """One registered format. Groupwise: signed codes in [qmin, qmax], one fp16 scale per `group`
    lanes along K; `bits` per code, split into a 4-bit (or 8-bit, W8) base plane and a high-bit
    plane of `bits - 4` bits (Q5 / Q6). FP8: e4m3fn codes with a 128 x 128 block scale."""

    name: str  # our name (artifact manifests, --weights)
    kind: str  # "groupwise" | "fp8"
    bits: int  # bits per code
    group: int  # lanes per scale along K (fp8: the block edge)
    qmin: int = 0
    qmax: int = 0
    seed_v2: str = ""  # the seed system's container names of the same format
    seed_v3: str = ""

    @property
    def base_bits(self) -> int:
        """Bits per lane in the base plane: the low nibble (Q4 / Q5 / Q6) or the whole byte (W8, fp8)."""
        return 4 if self.bits < 8 else 8

    @property
    def high_bits(self) -> int:
        """Bits per lane in the high plane (Q5: 1, Q6: 2, else 0)."""
        return self.bits - 4 if 4 < self.bits < 8 else 0

    @property
    def sign(self) -> int:
        """The sign bit of a code's two's-complement word (groupwise)."""
        return 1 << (self.bits - 1)

    @property
    def bits_per_weight(self) -> float:
        """Logical storage cost of a full group: code bits plus the scale's share."""
        if self.kind == "fp8":
            return 8 + 32 / (FP8_BLOCK * FP8_BLOCK)
        return self.bits + 16 / self.group


Q4 = WeightFormat("q4_g64", "groupwise", 4, 64, -8, 7, "Q4G64_F16S", "q4_g64_fp16")
Q5 = WeightFormat("q5_g64", "groupwise", 5, 64, -16, 15, "Q5G64_F16S", "q5_g64_fp16")
Q6 = WeightFormat("q6_g64", "groupwise", 6, 64, -32, 31, "Q6G64_F16S", "q6_g64_fp16")
W8 = WeightFormat("q8_g32", "groupwise", 8, 32, -127, 127, "W8G32_F16S", "q8_g32_fp16")
FP8 = WeightFormat("fp8_e4m3_b128", "fp8", 8, FP8_BLOCK)

FORMATS: dict[str, WeightFormat] = {f.name: f for f in (Q4, Q5, Q6, W8, FP8)}


def format_of(name: str) -> WeightFormat:
    """The registered format called `name` (ours or either seed spelling); ValueError names the valid ones."""
    for f in FORMATS.values():
        if name in (f.name, f.seed_v2, f.seed_v3):
            return f
    raise ValueError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}")


def is_quantized(name: str) -> bool:
    """Whether `name` is a registered quantized format (not a plain dtype such as bf16)."""
    try:
        format_of(name)
    except ValueError:
        return False
    return True


def padded_k(k: int) -> int:
    """K of the stored planes: k rounded up to a multiple of 128."""
    return -(-k // K_ALIGN) * K_ALIGN


class PlaneShapeError(ValueError):
    """A logical shape a format cannot store (or planes that do not match it)."""


def plane_shapes(shape: Sequence[int], fmt: WeightFormat) -> dict[str, tuple[int, ...]]:
    """The stored planes' shapes of a weight of logical `shape` ([N, K] or [E, N, K]) in `fmt`:
    groupwise base [R, Kp * base_bits / 8], high [R, Kp * high_bits / 8] (Q5 / Q6), scale [R, Kp / G];
    fp8 base [R, K], scale [E * ceil(N / 128), ceil(K / 128)] (each expert's blocks of its own; E = 1
    for a matrix) (R = prod(shape[:-1]), Kp = padded K)."""
    if len(shape) not in (2, 3) or min(shape) <= 0:
        raise PlaneShapeError(f"quantized weights are [N, K] or [E, N, K]; got {list(shape)}")
    rows = 1
    for d in shape[:-1]:
        rows *= d
    k = shape[-1]
    if fmt.kind == "fp8":
        experts = shape[0] if len(shape) == 3 else 1
        return {"base": (rows, k), "scale": (experts * -(-shape[-2] // FP8_BLOCK), -(-k // FP8_BLOCK))}
    kp = padded_k(k)
    out: dict[str, tuple[int, ...]] = {"base": (rows, kp * fmt.base_bits // 8), "scale": (rows, kp // fmt.group)}
    if fmt.high_bits:
        out["high"] = (rows, kp * fmt.high_bits // 8)
    return out
