"""`QuantWeight`: a quantized matrix (or bank of expert matrices) as the model holds it: the format,
the logical shape and the stored planes, with the row operations the model needs (fusing parts that
read one input, gathering rows, one expert's view) and the reference dequantization."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ninfer.formats import fp8, groupwise
from ninfer.formats.registry import FP8_BLOCK, PLANE_SEP, WeightFormat, format_of, padded_k, plane_shapes


@dataclass(frozen=True, eq=False)
class QuantWeight:
    """A quantized weight of logical shape [N, K] (a projection) or [E, N, K] (an expert bank).

    Planes cover R = prod(shape[:-1]) rows (an expert bank's rows expert-major):
        groupwise: base uint8 [R, Kp * base_bits / 8], high uint8 [R, Kp * high_bits / 8] (Q5 / Q6,
                   else None), scale fp16 [R, Kp / G]   (Kp = K rounded up to 128; `groupwise`)
        fp8:       base float8_e4m3fn [R, K], high None, scale fp32 [E * ceil(N / 128), ceil(K / 128)]
                   (an expert's blocks are its own: E = 1 for a matrix)
    """

    fmt: WeightFormat
    shape: tuple[int, ...]
    base: torch.Tensor
    high: torch.Tensor | None
    scale: torch.Tensor

    def __post_init__(self) -> None:
        want = plane_shapes(self.shape, self.fmt)
        got = {"base": tuple(self.base.shape), "scale": tuple(self.scale.shape)}
        if self.high is not None:
            got["high"] = tuple(self.high.shape)
        if got != want:
            raise groupwise.FormatError(f"{self.fmt.name} {list(self.shape)}: planes {got}, expected {want}")

    # ------------------------------------------------------------------ shape
    @property
    def rows(self) -> int:
        """R: the planes' rows (N, or E * N for an expert bank)."""
        return self.base.shape[0]

    @property
    def n(self) -> int:
        return self.shape[-2]

    @property
    def k(self) -> int:
        return self.shape[-1]

    @property
    def device(self) -> torch.device:
        return self.base.device

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.planes().values())

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per logical weight (padding and scales included)."""
        return 8 * self.nbytes / (self.rows * self.k)

    def planes(self) -> dict[str, torch.Tensor]:
        """The stored planes by name (`base`, `high` when present, `scale`)."""
        out = {"base": self.base, "scale": self.scale}
        if self.high is not None:
            out["high"] = self.high
        return out

    # ------------------------------------------------------------------ moves and views
    def to(self, device: torch.device | str) -> QuantWeight:
        return replace(
            self,
            base=self.base.to(device),
            high=None if self.high is None else self.high.to(device),
            scale=self.scale.to(device),
        )

    def expert(self, e: int) -> QuantWeight:
        """Expert e of an [E, N, K] bank as an [N, K] weight (views of the planes)."""
        if len(self.shape) != 3:
            raise ValueError("expert() needs an [E, N, K] bank")
        n = self.n
        lo, hi = e * n, (e + 1) * n
        if self.fmt.kind == "fp8":
            nb = -(-n // FP8_BLOCK)
            s = self.scale[e * nb : (e + 1) * nb]
            return QuantWeight(self.fmt, (n, self.k), self.base[lo:hi], None, s)
        high = None if self.high is None else self.high[lo:hi]
        return QuantWeight(self.fmt, (n, self.k), self.base[lo:hi], high, self.scale[lo:hi])

    def select_rows(self, index: torch.Tensor) -> QuantWeight:
        """Rows `index` [M] of an [N, K] groupwise weight (a proposal head's vocabulary subset)."""
        if self.fmt.kind != "groupwise" or len(self.shape) != 2:
            raise ValueError(
                f"row selection needs an [N, K] groupwise weight (got {self.fmt.name} {self.shape})"
            )
        high = None if self.high is None else self.high[index]
        return QuantWeight(self.fmt, (index.numel(), self.k), self.base[index], high, self.scale[index])

    # ------------------------------------------------------------------ values
    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The represented weight in the logical shape (fp32 reconstruction, then cast)."""
        if self.fmt.kind == "fp8" and len(self.shape) == 3:
            return torch.stack([self.expert(e).dequantize() for e in range(self.shape[0])]).to(dtype)
        if self.fmt.kind == "fp8":
            w = fp8.dequantize(self.base, self.scale)
        else:
            w = groupwise.dequantize(self.base, self.high, self.scale, self.fmt, self.k)
        return w.view(self.shape).to(dtype)

    def dequantize_rows(self, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `index` [...] of an [N, K] weight, dequantized -> [..., K] (an embedding lookup)."""
        flat = index.reshape(-1)
        if self.fmt.kind == "fp8":
            s = fp8.expand(self.scale, self.rows, self.k)[flat]
            out = self.base[flat].to(torch.float32) * s
        else:
            high = None if self.high is None else self.high[flat]
            out = groupwise.dequantize(self.base[flat], high, self.scale[flat], self.fmt, self.k)
        return out.to(dtype).view(*index.shape, self.k)


def quantize(w: torch.Tensor, fmt: WeightFormat | str) -> QuantWeight:
    """Encode w [N, K] or [E, N, K] (groupwise: the canonical encoder; fp8: the block encoder)."""
    f = format_of(fmt) if isinstance(fmt, str) else fmt
    shape = tuple(w.shape)
    if len(shape) not in (2, 3):
        raise groupwise.FormatError(f"only [N, K] and [E, N, K] weights quantize; got {list(shape)}")
    flat = w.reshape(-1, shape[-1])
    if f.kind == "fp8":
        if len(shape) == 3:  # per expert, so no block spans two experts
            parts = [fp8.encode(w[e]) for e in range(shape[0])]
            codes = torch.cat([c for c, _ in parts])
            scale = torch.cat([s for _, s in parts])
        else:
            codes, scale = fp8.encode(flat)
        return QuantWeight(f, shape, codes, None, scale)
    codes, scales = groupwise.encode(flat, f)
    base, high, scale = groupwise.pack(codes, scales, f)
    return QuantWeight(f, shape, base, high, scale)


def cat_rows(parts: Sequence[QuantWeight]) -> QuantWeight:
    """[N_i, K] weights of one format -> one [sum N_i, K] weight, rows in order (fusing projections
    that read one input). fp8 parts other than the last must have N_i % 128 == 0 (no block spans two)."""
    first = parts[0]
    for p in parts:
        if p.fmt != first.fmt or len(p.shape) != 2 or p.k != first.k:
            raise ValueError("only [N, K] weights of one format and K concatenate")
    if first.fmt.kind == "fp8" and any(p.n % FP8_BLOCK for p in parts[:-1]):
        raise ValueError(f"fp8 parts concatenate only at {FP8_BLOCK}-row block boundaries")
    high = None if first.high is None else torch.cat([p.high for p in parts if p.high is not None])
    shape = (sum(p.n for p in parts), first.k)
    return QuantWeight(
        first.fmt, shape, torch.cat([p.base for p in parts]), high, torch.cat([p.scale for p in parts])
    )


def can_cat(parts: Sequence[QuantWeight]) -> bool:
    """Whether `cat_rows(parts)` is possible (one format, one K, fp8 block boundaries)."""
    first = parts[0]
    if any(p.fmt != first.fmt or len(p.shape) != 2 or p.k != first.k for p in parts):
        return False
    return first.fmt.kind != "fp8" or all(p.n % FP8_BLOCK == 0 for p in parts[:-1])


def from_planes(
    fmt: WeightFormat | str, shape: Sequence[int], planes: dict[str, torch.Tensor]
) -> QuantWeight:
    """A weight from its stored planes (artifact reading); shapes are checked."""
    f = format_of(fmt) if isinstance(fmt, str) else fmt
    unknown = set(planes) - {"base", "high", "scale"}
    if unknown:
        raise groupwise.FormatError(f"unknown planes {sorted(unknown)}")
    if "base" not in planes or "scale" not in planes:
        raise groupwise.FormatError(f"{f.name}: planes base and scale are required; got {sorted(planes)}")
    return QuantWeight(f, tuple(shape), planes["base"], planes.get("high"), planes["scale"])


def stack_experts(parts: Sequence[QuantWeight]) -> QuantWeight:
    """E weights [N, K] of one format -> the bank [E, N, K] (expert-major rows and scale blocks)."""
    first = parts[0]
    if any(p.fmt != first.fmt or p.shape != first.shape for p in parts):
        raise ValueError("experts stack only with one format and one shape")
    high = None if first.high is None else torch.cat([p.high for p in parts if p.high is not None])
    return QuantWeight(
        first.fmt,
        (len(parts), *first.shape),
        torch.cat([p.base for p in parts]),
        high,
        torch.cat([p.scale for p in parts]),
    )


__all__ = [
    "PLANE_SEP", "QuantWeight", "can_cat", "cat_rows", "from_planes", "padded_k", "plane_shapes", "quantize",
    "stack_experts",
]  # fmt: skip
