"""File-level helpers: safetensors header parsing with truncation checks, sha256 digests."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

from ninfer.artifact.errors import ArtifactError

# safetensors dtype tag -> bytes per element
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """One tensor entry of a safetensors header."""

    dtype: str  # safetensors tag, e.g. "BF16"
    shape: tuple[int, ...]
    nbytes: int


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and check a safetensors header; a truncated or malformed file raises ArtifactError."""
    if not path.is_file():
        raise ArtifactError(f"missing file {path}")
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ArtifactError(f"{path}: truncated safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise ArtifactError(
                f"{path}: truncated or corrupt safetensors file (header of {n} bytes, file {size})"
            )
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ArtifactError(f"{path}: corrupt safetensors header") from None
    if not isinstance(header, dict):
        raise ArtifactError(f"{path}: corrupt safetensors header")
    header.pop("__metadata__", None)
    out: dict[str, TensorInfo] = {}
    end = 0
    for name, entry in header.items():
        try:
            dtype, shape, (lo, hi) = (
                entry["dtype"],
                tuple(int(s) for s in entry["shape"]),
                entry["data_offsets"],
            )
            numel = 1
            for s in shape:
                numel *= s
            if hi - lo != numel * DTYPE_SIZES[dtype] or lo < 0:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ArtifactError(f"{path}: corrupt safetensors header entry {name!r}") from None
        out[name] = TensorInfo(dtype=dtype, shape=shape, nbytes=hi - lo)
        end = max(end, hi)
    if 8 + n + end != size:
        raise ArtifactError(
            f"{path}: truncated safetensors file ({size} bytes on disk, header promises {8 + n + end})"
        )
    return out


def sha256_file(path: Path, chunk: int = 16 << 20) -> str:
    """Hex sha256 of a file, read in chunks (never whole into memory)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def digest_tree(root: Path, skip: str = "manifest.json") -> dict[str, str]:
    """sha256 of every regular file under `root` except `skip`, keyed by POSIX relative path."""
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).as_posix() != skip
    }
