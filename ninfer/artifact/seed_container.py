"""Reader of the seed system's single-file `.ninfer` container, version 2 and version 3 (multi-part).

Written from the seed's public documents (`docs/maintainer/artifact-container.md`,
`storage-layouts.md`, `tensor-formats.md`); the generic part only: framing, the closed JSON
directory, payload geometry, the format / layout registry, v3 bindings, uses, components and
continuation parts. What the objects mean for our model is `seed_layouts`.

v2: 16-byte prefix `NINFER\\0\\2` + u64 LE JSON length; JSON root exactly `{identity: {model_id,
weights_id}, objects}`; objects `{name, kind, shape, format, layout, offset, bytes}` (tensor) or
`{name, kind, encoding, offset, bytes}` (resource); payload from the first 4096-byte boundary after
the JSON, offsets relative to it.

v3: 32-byte header `NINFER\\0\\3` + u64 LE JSON length + 16-byte artifact id; continuation parts
(`NINPRT\\0\\3` + u64 part index + the same artifact id, payload from byte 4096) hold the rest of
one logical payload whose split is the root's `files` table; objects carry `id` instead of `name`;
format and layout names are snake_case; `components`, `bindings` (logical parameter -> whole object
or element ranges of objects) and `uses` are checked for closed member sets and references.

Every rule a file breaks raises `SeedFormatError` (an `ArtifactError`) naming the file and the
object; nothing here raises anything else for a malformed file. Payload bytes are memory-mapped
copy-on-write; an object inside one file is a zero-copy view, one that straddles two parts is copied.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ninfer.artifact.errors import ArtifactError

if TYPE_CHECKING:
    import torch

MAGIC_V1 = b"NINFER\x00\x01"
MAGIC_V2 = b"NINFER\x00\x02"
MAGIC_V3 = b"NINFER\x00\x03"
MAGIC_PART = b"NINPRT\x00\x03"
PAYLOAD_ALIGN = 4096
PART_PAYLOAD_START = 4096
U64_MAX = 2**64 - 1
MAX_RANK = 16


class SeedFormatError(ArtifactError):
    """A seed-format file breaks a documented container rule (the message names the object)."""


# ----------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class SeedFormat:
    """One registered numeric format: its v3 and v2 spellings, its kind and its word size."""

    v3: str
    v2: str | None
    kind: str  # direct | groupwise | nvfp4 | fp8_row | u4z8
    word_bytes: int = 0  # direct formats: bytes per element; fp8_row: bytes per row scale
    bits: int = 0  # groupwise: code bits
    group: int = 0  # groupwise / u4z8: lanes per scale


FORMATS: dict[str, SeedFormat] = {
    f.v3: f
    for f in (
        SeedFormat("bf16", "BF16", "direct", 2),
        SeedFormat("fp32", "FP32", "direct", 4),
        SeedFormat("int32", "I32", "direct", 4),
        SeedFormat("int64", "I64", "direct", 8),
        SeedFormat("q4_g64_fp16", "Q4G64_F16S", "groupwise", bits=4, group=64),
        SeedFormat("q5_g64_fp16", "Q5G64_F16S", "groupwise", bits=5, group=64),
        SeedFormat("q6_g64_fp16", "Q6G64_F16S", "groupwise", bits=6, group=64),
        SeedFormat("q8_g32_fp16", "W8G32_F16S", "groupwise", bits=8, group=32),
        SeedFormat("nvfp4", "NVFP4", "nvfp4"),
        SeedFormat("fp8_e4m3fn_row_bf16", "FP8_E4M3FN_ROW_BF16S", "fp8_row", 2),
        SeedFormat("fp8_e4m3fn_row_fp32", "FP8_E4M3FN_ROW_F32S", "fp8_row", 4),
        SeedFormat("u4z8_g16_fp16", "U4Z8G16_F16S", "u4z8", group=16),
    )
}


@dataclass(frozen=True)
class SeedLayout:
    """One registered tensor layout: spellings, the formats it stores, its object alignment."""

    v3: str
    v2: str | None
    formats: frozenset[str]
    align: int = 256


LAYOUTS: dict[str, SeedLayout] = {
    lay.v3: lay
    for lay in (
        SeedLayout("contiguous_le_v1", "contiguous-le-v1", frozenset({"bf16", "fp32", "int32", "int64"})),
        SeedLayout(
            "row_split_k128_v1",
            "row-split-k128-v1",
            frozenset({"q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"}),
        ),
        SeedLayout("block_scale_k16_m128x4_v1", "blockscale-k16-m128x4-v1", frozenset({"nvfp4"})),
        SeedLayout(
            "expert_block_scale_k16_m128x4_v1", "expert-blockscale-k16-m128x4-v1", frozenset({"nvfp4"})
        ),
        SeedLayout("row_scale_v1", "row-scale-v1", frozenset({"fp8_e4m3fn_row_bf16"})),
        SeedLayout("row_scale_fp32_v1", "row-scale-f32-v1", frozenset({"fp8_e4m3fn_row_fp32"})),
        SeedLayout("packed_u4_g16_v1", "packed-u4-g16-v1", frozenset({"u4z8_g16_fp16"})),
    )
}
ENCODINGS = {"raw_bytes_v1": "raw-bytes-v1"}  # resource encoding (alignment 1)
ACTIVATION_POLICIES = ("A16Only", "AllowA8", "AllowA4")


def _lookup(table: dict[str, Any], name: str, version: int) -> Any:
    """A registry entry by the spelling of `version` (v2: the upper-case / dashed names)."""
    if version >= 3:
        return table.get(name)
    for entry in table.values():
        if getattr(entry, "v2", entry) == name:
            return entry
    return None


def align_up(x: int, a: int) -> int:
    return -(-x // a) * a


def groupwise_geometry(fmt: SeedFormat, n: int, k: int) -> tuple[int, int, int, int]:
    """row_split_k128_v1 of [n, k]: (base bytes, high offset, scale offset, total bytes)."""
    kp = align_up(k, 128)
    groups = n * (kp // fmt.group)
    base = groups * 32  # 32 base bytes per group: 64 nibbles (Q4/Q5/Q6) or 32 int8 (W8)
    high = groups * (fmt.group * (fmt.bits - 4) // 8 if 4 < fmt.bits < 8 else 0)
    high_off = align_up(base, 256)
    scale_off = high_off + align_up(high, 256)
    return base, high_off, scale_off, scale_off + groups * 2


def encoded_size(fmt: SeedFormat, layout: SeedLayout, shape: tuple[int, ...]) -> int:
    """The exact encoded byte length of a (format, layout, shape); ValueError says why it is illegal."""
    if fmt.v3 not in layout.formats:
        raise ValueError(f"format {fmt.v3} cannot use layout {layout.v3}")
    numel = math.prod(shape)
    if layout.v3 == "contiguous_le_v1":
        if len(shape) > MAX_RANK:
            raise ValueError(f"rank {len(shape)} exceeds {MAX_RANK}")
        return numel * fmt.word_bytes
    if layout.v3 == "expert_block_scale_k16_m128x4_v1":
        if len(shape) != 3:
            raise ValueError(f"layout {layout.v3} stores [E, N, K] banks, not {list(shape)}")
        e, n, k = shape
        if n % 128 or k % 64:
            raise ValueError(f"layout {layout.v3} needs N % 128 == 0 and K % 64 == 0 (got {list(shape)})")
        return align_up(e * n * k // 2, 256) + e * n * k // 16 + 4 * e
    if len(shape) != 2:
        raise ValueError(f"layout {layout.v3} stores [N, K] matrices, not {list(shape)}")
    n, k = shape
    if layout.v3 == "row_split_k128_v1":
        return groupwise_geometry(fmt, n, k)[3]
    if layout.v3 == "block_scale_k16_m128x4_v1":
        if n % 128 or k % 64:
            raise ValueError(f"layout {layout.v3} needs N % 128 == 0 and K % 64 == 0 (got {list(shape)})")
        return align_up(n * k // 2, 256) + n * k // 16 + 4
    if layout.v3 in ("row_scale_v1", "row_scale_fp32_v1"):
        return align_up(n * k, 256) + n * fmt.word_bytes
    if layout.v3 == "packed_u4_g16_v1":
        if k % 16:
            raise ValueError(f"layout {layout.v3} needs K % 16 == 0 (got {list(shape)})")
        return align_up(n * k // 2, 256) + n * (k // 16) * 2
    raise ValueError(f"layout {layout.v3} has no size rule")  # pragma: no cover - closed table


# ----------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class SeedObject:
    """One directory object: a tensor (shape, format, layout) or a resource (encoding)."""

    name: str
    kind: str  # tensor | resource
    offset: int
    nbytes: int
    shape: tuple[int, ...] = ()
    format: str = ""  # v3 spelling
    layout: str = ""  # v3 spelling
    encoding: str = ""

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Part:
    """Elements [begin, end) of an object's logical C-order element sequence."""

    object: str
    begin: int
    end: int


@dataclass(frozen=True)
class SeedComponent:
    """A v3 component: its HF-style config, the component it serves, its resource roles."""

    name: str
    config: dict[str, Any]
    target: str | None
    resources: dict[str, str]  # role (e.g. "tokenizer.json") -> resource object id
    proposal: dict[str, Any] | None


@dataclass(frozen=True)
class SeedPart:
    """One file of the set: where it is, where its payload starts, its share of the logical payload."""

    path: Path
    payload_start: int
    payload_bytes: int
    logical_start: int


@dataclass
class SeedFile:
    """An opened, structurally valid seed container. `bindings` is empty for v2 (its object names are
    the model's binding names; `seed_layouts` derives them)."""

    path: Path
    version: int
    model_id: str | None
    weights_id: str | None
    artifact_id: bytes | None
    objects: dict[str, SeedObject]
    components: dict[str, SeedComponent]
    bindings: dict[str, tuple[Part, ...]]
    uses: list[dict[str, Any]]
    parts: list[SeedPart]
    metadata: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    _maps: dict[int, mmap.mmap] = field(default_factory=dict, repr=False)

    @property
    def payload_bytes(self) -> int:
        return sum(p.payload_bytes for p in self.parts)

    def tensors(self) -> list[SeedObject]:
        return [o for o in self.objects.values() if o.kind == "tensor"]

    def resource_roles(self) -> dict[str, str]:
        """Every frontend resource role -> object id (v2: `frontend/<file name>`)."""
        if self.version == 2:
            return {
                o.name.removeprefix("frontend/"): o.name
                for o in self.objects.values()
                if o.kind == "resource" and o.name.startswith("frontend/")
            }
        out: dict[str, str] = {}
        for comp in self.components.values():
            out.update(comp.resources)
        return out

    def _map(self, i: int) -> mmap.mmap:
        if i not in self._maps:
            part = self.parts[i]
            with part.path.open("rb") as f:
                self._maps[i] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._maps[i]

    def read(self, obj: SeedObject) -> memoryview | bytes:
        """The object's payload bytes: a view into one file's map, or a copy when it spans parts."""
        lo, hi = obj.offset, obj.offset + obj.nbytes
        chunks: list[memoryview] = []
        for i, part in enumerate(self.parts):
            a, b = max(lo, part.logical_start), min(hi, part.logical_start + part.payload_bytes)
            if a >= b:
                continue
            start = part.payload_start + (a - part.logical_start)
            chunks.append(memoryview(self._map(i))[start : start + (b - a)])
        if sum(len(c) for c in chunks) != obj.nbytes:  # the geometry checks make this unreachable
            raise SeedFormatError(f"{self.path}: object {obj.name!r}: payload range is not in the file set")
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def resource(self, name: str) -> bytes:
        obj = self.objects.get(name)
        if obj is None or obj.kind != "resource":
            raise SeedFormatError(f"{self.path}: no resource object {name!r}")
        return bytes(self.read(obj))

    def tensor_u8(self, obj: SeedObject) -> torch.Tensor:
        """The object's payload as a uint8 tensor (mmap-backed when it lies in one file)."""
        import torch

        data = self.read(obj)
        if isinstance(data, bytes):
            data = bytearray(data)
        return torch.frombuffer(data, dtype=torch.uint8)

    def close(self) -> None:
        for m in self._maps.values():
            try:
                m.close()
            except BufferError:  # a tensor still views it: the map lives until that tensor dies
                pass
        self._maps.clear()


# ----------------------------------------------------------------------------------------- checks
class _Check:
    """Typed accessors over decoded JSON that raise one-line errors naming where the value is."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, msg: str) -> SeedFormatError:
        return SeedFormatError(f"{self.path}: {where}: {msg}")

    def obj(
        self, v: Any, where: str, required: set[str], optional: frozenset[str] | set[str] = frozenset()
    ) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(where, f"must be a JSON object, not {type(v).__name__}")
        missing = sorted(required - set(v))
        if missing:
            raise self.fail(where, f"missing member {missing[0]!r}")
        extra = sorted(set(v) - required - optional)
        if extra:
            raise self.fail(where, f"unknown member {extra[0]!r} (the directory schema is closed)")
        return v

    def uint(self, v: Any, where: str, positive: bool = False) -> int:
        if type(v) is not int or v < (1 if positive else 0) or v > U64_MAX:
            want = "a positive" if positive else "a non-negative"
            raise self.fail(where, f"must be {want} 64-bit integer, not {v!r}")
        return v

    def ident(self, v: Any, where: str) -> str:
        if not isinstance(v, str) or not v or "\x00" in v:
            raise self.fail(where, f"must be a non-empty string without NUL, not {v!r}")
        return v

    def shape(self, v: Any, where: str) -> tuple[int, ...]:
        if not isinstance(v, list) or len(v) > MAX_RANK:
            raise self.fail(where, f"shape must be a list of at most {MAX_RANK} positive integers, not {v!r}")
        return tuple(self.uint(d, where + " shape", positive=True) for d in v)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"member {k!r} appears twice in one JSON object")
        out[k] = v
    return out


def _parse_json(ck: _Check, raw: bytes) -> dict[str, Any]:
    def bad_constant(c: str) -> Any:
        raise ValueError(f"non-standard JSON constant {c}")

    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=bad_constant)
    except UnicodeDecodeError as exc:
        raise ck.fail("directory", f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:  # JSONDecodeError included
        raise ck.fail("directory", f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ck.fail("directory", "the root must be a JSON object")
    return doc


def _objects(ck: _Check, raw: Any, version: int, payload_bytes: int) -> dict[str, SeedObject]:
    if not isinstance(raw, list) or not raw:
        raise ck.fail("objects", "must be a non-empty array")
    key = "name" if version == 2 else "id"
    out: dict[str, SeedObject] = {}
    cursor = 0
    for i, o in enumerate(raw):
        where = f"objects[{i}]"
        name = ck.ident(o.get(key) if isinstance(o, dict) else None, f"{where} {key}")
        where = f"object {name!r}"
        kind = o.get("kind")
        if kind == "tensor":
            ck.obj(o, where, {key, "kind", "shape", "format", "layout", "offset", "bytes"})
            shape = ck.shape(o["shape"], where)
            fmt = _lookup(FORMATS, o["format"], version) if isinstance(o["format"], str) else None
            if fmt is None:
                raise ck.fail(where, f"unknown format {o['format']!r}")
            lay = _lookup(LAYOUTS, o["layout"], version) if isinstance(o["layout"], str) else None
            if lay is None:
                raise ck.fail(where, f"unknown layout {o['layout']!r}")
            try:
                want = encoded_size(fmt, lay, shape)
            except ValueError as exc:
                raise ck.fail(where, str(exc)) from None
            offset, nbytes = (
                ck.uint(o["offset"], where + " offset"),
                ck.uint(o["bytes"], where + " bytes", True),
            )
            if nbytes != want:
                raise ck.fail(where, f"bytes {nbytes} != {want}, the encoded size of {fmt.v3} {list(shape)}")
            obj = SeedObject(name, kind, offset, nbytes, shape, fmt.v3, lay.v3)
            align = lay.align
        elif kind == "resource":
            ck.obj(o, where, {key, "kind", "encoding", "offset", "bytes"})
            enc = o["encoding"]
            if not isinstance(enc, str) or (
                enc not in ENCODINGS if version >= 3 else enc not in ENCODINGS.values()
            ):
                raise ck.fail(where, f"unknown resource encoding {enc!r}")
            offset, nbytes = (
                ck.uint(o["offset"], where + " offset"),
                ck.uint(o["bytes"], where + " bytes", True),
            )
            obj = SeedObject(name, kind, offset, nbytes, encoding="raw_bytes_v1")
            align = 1
        else:
            raise ck.fail(where, f"kind must be 'tensor' or 'resource', not {kind!r}")
        if name in out:
            raise ck.fail(where, "the name is used by two objects")
        if offset < cursor:
            raise ck.fail(where, f"offset {offset} overlaps the previous object (which ends at {cursor})")
        if offset % align:
            raise ck.fail(where, f"offset {offset} is not {align}-byte aligned")
        if offset + nbytes > payload_bytes:
            raise ck.fail(
                where, f"bytes [{offset}, {offset + nbytes}) run past the payload's {payload_bytes} bytes"
            )
        cursor = offset + nbytes
        out[name] = obj
    return out


def _header(ck: _Check, path: Path, size: int) -> tuple[bytes, int, bytes | None]:
    """(magic, json length, artifact id or None) of the entry file."""
    with path.open("rb") as f:
        head = f.read(32)
    magic = head[:8]
    if magic == MAGIC_PART:
        raise ck.fail("header", "this is a continuation part (NINPRT); open the entry .ninfer file")
    if magic == MAGIC_V1:
        raise ck.fail("header", "container version 1 is not read (only versions 2 and 3)")
    if magic not in (MAGIC_V2, MAGIC_V3):
        raise ck.fail("header", f"bad magic {magic!r} (not a seed .ninfer v2 or v3 file)")
    hdr = 16 if magic == MAGIC_V2 else 32
    if len(head) < hdr:
        raise ck.fail("header", f"truncated: {len(head)} bytes, the header has {hdr}")
    (json_bytes,) = struct.unpack_from("<Q", head, 8)
    if json_bytes == 0:
        raise ck.fail("header", "the JSON length is zero")
    if hdr + json_bytes > size:
        raise ck.fail("header", f"the JSON ({json_bytes} bytes) runs past the end of the file ({size} bytes)")
    return magic, json_bytes, head[16:32] if magic == MAGIC_V3 else None


def _files(ck: _Check, raw: Any, entry: Path) -> list[tuple[Path, int]]:
    if not isinstance(raw, list) or not raw:
        raise ck.fail("files", "must be a non-empty array")
    out: list[tuple[Path, int]] = []
    seen: set[str] = set()
    for i, f in enumerate(raw):
        where = f"files[{i}]"
        ck.obj(f, where, {"path", "payload_bytes"})
        n = ck.uint(f["payload_bytes"], where + " payload_bytes", positive=True)
        p = f["path"]
        if i == 0:
            if p is not None:
                raise ck.fail(where, "the entry's path must be null")
            out.append((entry, n))
            continue
        if (
            not isinstance(p, str)
            or not p
            or any(c in p for c in "/\\\x00")
            or p in (".", "..")
            or p == entry.name
            or p in seen
        ):
            raise ck.fail(where, f"bad continuation file name {p!r}")
        seen.add(p)
        out.append((entry.parent / p, n))
    return out


def _check_part(ck: _Check, path: Path, index: int, payload: int, artifact_id: bytes) -> None:
    where = f"part {path.name}"
    if not path.is_file():
        raise ck.fail(where, "continuation file is missing")
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(32)
    if len(head) < 32 or head[:8] != MAGIC_PART:
        raise ck.fail(where, f"bad part magic {head[:8]!r}")
    (got,) = struct.unpack_from("<Q", head, 8)
    if got != index:
        raise ck.fail(where, f"part index {got}, the directory lists it as {index}")
    if head[16:32] != artifact_id:
        raise ck.fail(
            where, f"artifact id {head[16:32].hex()} belongs to another artifact ({artifact_id.hex()})"
        )
    if size != PART_PAYLOAD_START + payload:
        raise ck.fail(
            where, f"{size} bytes, the directory implies {PART_PAYLOAD_START + payload} (truncated part?)"
        )


def _binding(ck: _Check, v: Any, where: str, objects: dict[str, SeedObject]) -> tuple[Part, ...]:
    if not isinstance(v, dict) or len(v) != 1 or next(iter(v)) not in ("object", "parts"):
        raise ck.fail(where, "a binding is exactly {object: ID} or {parts: [...]}")
    if "object" in v:
        name = ck.ident(v["object"], where + " object")
        obj = objects.get(name)
        if obj is None or obj.kind != "tensor":
            raise ck.fail(where, f"refers to {name!r}, which is not a tensor object")
        return (Part(name, 0, obj.elements),)
    parts = v["parts"]
    if not isinstance(parts, list) or not parts:
        raise ck.fail(where, "parts must be a non-empty array")
    out = []
    for j, p in enumerate(parts):
        pw = f"{where} part {j}"
        ck.obj(p, pw, {"object", "range"})
        name = ck.ident(p["object"], pw + " object")
        obj = objects.get(name)
        if obj is None or obj.kind != "tensor":
            raise ck.fail(pw, f"refers to {name!r}, which is not a tensor object")
        r = p["range"]
        if not isinstance(r, list) or len(r) != 2:
            raise ck.fail(pw, f"range must be [begin, end], not {r!r}")
        b, e = ck.uint(r[0], pw + " range"), ck.uint(r[1], pw + " range")
        if not b < e <= obj.elements:
            raise ck.fail(pw, f"range [{b}, {e}) is not inside the {obj.elements} elements of {name!r}")
        out.append(Part(name, b, e))
    return tuple(out)


def _v3_tables(
    ck: _Check, doc: dict[str, Any], objects: dict[str, SeedObject]
) -> tuple[dict[str, SeedComponent], dict[str, tuple[Part, ...]], list[dict[str, Any]]]:
    comps_raw = doc["components"]
    if not isinstance(comps_raw, dict) or "text" not in comps_raw:
        raise ck.fail("components", "must be an object with a 'text' component")
    comps: dict[str, SeedComponent] = {}
    for name, c in comps_raw.items():
        where = f"component {name!r}"
        ck.ident(name, "components")
        ck.obj(c, where, {"config"}, {"target", "resources", "proposal"})
        if not isinstance(c["config"], dict):
            raise ck.fail(where, "config must be a JSON object")
        target = c.get("target")
        if target is not None and (not isinstance(target, str) or target not in comps_raw or target == name):
            raise ck.fail(where, f"target {target!r} is not another component")
        res = c.get("resources", {})
        if not isinstance(res, dict):
            raise ck.fail(where, "resources must be a JSON object")
        for role, ref in res.items():
            ck.ident(role, where + " resources")
            obj = objects.get(ref) if isinstance(ref, str) else None
            if obj is None or obj.kind != "resource":
                raise ck.fail(where, f"resource {role!r} refers to {ref!r}, which is not a resource object")
        proposal = c.get("proposal")
        if proposal is not None:
            if name != "text":
                raise ck.fail(where, "only the text component has a proposal")
            ck.obj(proposal, where + " proposal", {"domain"}, {"rows"})
            if proposal["domain"] == "indexed":
                ck.obj(proposal, where + " proposal", {"domain", "rows"})
                ck.uint(proposal["rows"], where + " proposal rows", positive=True)
            elif proposal["domain"] == "full":
                ck.obj(proposal, where + " proposal", {"domain"})
            else:
                raise ck.fail(where, f"proposal domain {proposal['domain']!r} is not 'full' or 'indexed'")
        comps[name] = SeedComponent(name, c["config"], target, dict(res), proposal)
    if not isinstance(doc["bindings"], dict):
        raise ck.fail("bindings", "must be a JSON object")
    bindings = {
        ck.ident(n, "bindings"): _binding(ck, b, f"binding {n!r}", objects)
        for n, b in doc["bindings"].items()
    }
    uses = doc["uses"]
    if not isinstance(uses, list):
        raise ck.fail("uses", "must be an array")
    seen: set[tuple[str, str]] = set()
    for i, u in enumerate(uses):
        where = f"uses[{i}]"
        ck.obj(u, where, {"parameter", "input"}, {"activation_policy", "auxiliaries"})
        param, inp = ck.ident(u["parameter"], where + " parameter"), ck.ident(u["input"], where + " input")
        if param not in bindings:
            raise ck.fail(where, f"parameter {param!r} has no binding")
        if (param, inp) in seen:
            raise ck.fail(where, f"({param!r}, {inp!r}) is listed twice")
        seen.add((param, inp))
        if "activation_policy" in u and u["activation_policy"] not in ACTIVATION_POLICIES:
            raise ck.fail(where, f"unknown activation_policy {u['activation_policy']!r}")
        aux = u.get("auxiliaries", {})
        if not isinstance(aux, dict):
            raise ck.fail(where, "auxiliaries must be a JSON object")
        for role, b in aux.items():
            _binding(ck, b, f"{where} auxiliary {role!r}", objects)
    return comps, bindings, uses


# ----------------------------------------------------------------------------------------- open
def is_seed_file(path: str | Path) -> bool:
    """Whether `path` is a regular file starting with a seed container magic (any version)."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as f:
        return f.read(6) in (b"NINFER", b"NINPRT")


def read_seed_file(path: str | Path) -> SeedFile:
    """Open and validate a seed container (v2 or v3, with its continuation parts)."""
    p = Path(path)
    ck = _Check(p)
    if not p.is_file():
        raise SeedFormatError(f"{p}: not a file")
    size = p.stat().st_size
    magic, json_bytes, artifact_id = _header(ck, p, size)
    hdr = 16 if magic == MAGIC_V2 else 32
    with p.open("rb") as f:
        f.seek(hdr)
        doc = _parse_json(ck, f.read(json_bytes))
    start = align_up(hdr + json_bytes, PAYLOAD_ALIGN)
    if magic == MAGIC_V2:
        ck.obj(doc, "directory root", {"identity", "objects"})
        ident = ck.obj(doc["identity"], "identity", {"model_id", "weights_id"})
        model_id = ck.ident(ident["model_id"], "identity model_id")
        weights_id = ck.ident(ident["weights_id"], "identity weights_id")
        if size < start:
            raise ck.fail("header", f"the file ends at {size}, before its payload start {start}")
        parts = [SeedPart(p, start, size - start, 0)]
        objects = _objects(ck, doc["objects"], 2, size - start)
        return SeedFile(p, 2, model_id, weights_id, None, objects, {}, {}, [], parts)
    ck.obj(
        doc,
        "directory root",
        {"components", "objects", "bindings", "uses", "files"},
        {"metadata", "provenance"},
    )
    for opt in ("metadata", "provenance"):
        if not isinstance(doc.get(opt, {}), dict):
            raise ck.fail(opt, "must be a JSON object")
    files = _files(ck, doc["files"], p)
    if size != start + files[0][1]:
        raise ck.fail(
            "files[0]",
            f"the entry file has {size} bytes, its header and files table imply {start + files[0][1]}",
        )
    assert artifact_id is not None
    parts, logical = [], 0
    for i, (fp, n) in enumerate(files):
        if i:
            _check_part(ck, fp, i, n, artifact_id)
        parts.append(SeedPart(fp, start if i == 0 else PART_PAYLOAD_START, n, logical))
        logical += n
    objects = _objects(ck, doc["objects"], 3, logical)
    comps, bindings, uses = _v3_tables(ck, doc, objects)
    metadata = doc.get("metadata", {})
    name = metadata.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise ck.fail("metadata", f"name must be a non-empty string, not {name!r}")
    prov = doc.get("provenance", {})
    upgraded = prov.get("upgraded_from") if isinstance(prov.get("upgraded_from"), dict) else {}
    weights_id = upgraded.get("weights_id") if isinstance(upgraded.get("weights_id"), str) else None
    return SeedFile(
        p, 3, name, weights_id, artifact_id, objects, comps, bindings, uses, parts, metadata, prov
    )


# ----------------------------------------------------------------------------------------- decode
def decode(sf: SeedFile, obj: SeedObject) -> dict[str, torch.Tensor]:
    """An object's planes as tensors (views of the payload where the layout allows):
    direct: {"values": [shape] typed}; groupwise: {"base", "high"?, "scale"} as `QuantWeight` planes
    ([N, Kp*bits/8] u8, [N, Kp*hb/8] u8, [N, Kp/G] fp16); other formats: {"dense": fp32 [shape]}."""
    import torch

    u8 = sf.tensor_u8(obj)
    fmt = FORMATS[obj.format]
    if fmt.kind == "direct":
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "int32": torch.int32, "int64": torch.int64}[
            fmt.v3
        ]
        return {"values": u8.view(dtype).view(obj.shape)}
    if fmt.kind == "groupwise":
        n, k = obj.shape
        kp = align_up(k, 128)
        base_n, high_off, scale_off, total = groupwise_geometry(fmt, n, k)
        out = {
            "base": u8[:base_n].view(n, kp * (4 if fmt.bits < 8 else 8) // 8),
            "scale": u8[scale_off:total].view(torch.float16).view(n, kp // fmt.group),
        }
        if 4 < fmt.bits < 8:
            out["high"] = u8[high_off:scale_off].narrow(0, 0, n * kp * (fmt.bits - 4) // 8).view(n, -1)
        return out
    return {"dense": dequantize_other(fmt, obj.layout, obj.shape, u8)}


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _nvfp4_matrix(
    codes: torch.Tensor, scales: torch.Tensor, divisor: torch.Tensor, n: int, k: int
) -> torch.Tensor:
    """One block_scale_k16_m128x4_v1 matrix -> fp32 [n, k]: e2m1(code) * e4m3fn(scale) / divisor."""
    import torch

    lut = torch.tensor(_E2M1, dtype=torch.float32)
    c = torch.stack([codes & 0xF, codes >> 4], dim=-1).view(n, k).long()  # low nibble: the smaller k
    # un-swizzle: scale (row, g) sits at (row//128 * K/64 + g//4) * 512 + (row%32)*16 + (row%128//32)*4 + g%4
    g = k // 16
    row = torch.arange(n).view(n, 1)
    grp = torch.arange(g).view(1, g)
    idx = ((row // 128) * (k // 64) + grp // 4) * 512 + (row % 32) * 16 + (row % 128 // 32) * 4 + grp % 4
    s = scales.view(torch.float8_e4m3fn)[idx.reshape(-1)].to(torch.float32).view(n, g)
    return (lut[c] * s.repeat_interleave(16, dim=1)) / divisor.view(torch.float32)[0]


def dequantize_other(fmt: SeedFormat, layout: str, shape: tuple[int, ...], u8: torch.Tensor) -> torch.Tensor:
    """NVFP4 (matrix or expert bank), row-scaled FP8 and u4z8 payloads -> fp32 in the logical shape
    (the documented reconstruction; used to load them weight-only as dense tensors)."""
    import torch

    if fmt.kind == "nvfp4":
        e, n, k = shape if len(shape) == 3 else (1, *shape)
        code_n = e * n * k // 2
        scale_off = align_up(code_n, 256)
        sc_n = n * k // 16
        div_off = scale_off + e * sc_n
        mats = [
            _nvfp4_matrix(
                u8[i * (code_n // e) : (i + 1) * (code_n // e)],
                u8[scale_off + i * sc_n : scale_off + (i + 1) * sc_n],
                u8[div_off + 4 * i : div_off + 4 * (i + 1)].clone(),
                n,
                k,
            )
            for i in range(e)
        ]
        return torch.stack(mats).view(shape) if len(shape) == 3 else mats[0]
    n, k = shape
    if fmt.kind == "fp8_row":
        scale_off = align_up(n * k, 256)
        codes = u8[: n * k].view(torch.float8_e4m3fn).view(n, k).to(torch.float32)
        sdt = torch.bfloat16 if fmt.word_bytes == 2 else torch.float32
        s = u8[scale_off : scale_off + n * fmt.word_bytes].clone().view(sdt).to(torch.float32)
        return codes * s.view(n, 1)
    if fmt.kind == "u4z8":
        scale_off = align_up(n * k // 2, 256)
        b = u8[: n * k // 2]
        c = torch.stack([b & 0xF, b >> 4], dim=-1).view(n, k).to(torch.float32) - 8.0
        s = u8[scale_off : scale_off + n * (k // 16) * 2].clone().view(torch.float16).to(torch.float32)
        return c * s.view(n, k // 16).repeat_interleave(16, dim=1)
    raise SeedFormatError(f"format {fmt.v3} has no decoder")  # pragma: no cover - closed table
