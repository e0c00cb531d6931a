"""A full-size synthetic file in the seed system's `.ninfer` v3 container, streamed to disk.

    python ops/bench/seed_synth.py --shape qwen3.6-27b OUT.ninfer [--layers N] [--no-mtp] [--seed S]
        [--part-limit BYTES] [--force]

Writes the seed's 27B groupwise-int inventory (its `qwen3.6-27b-artifact.md`: Q6 embedding and
output head; per full-attention layer a Q4 `attention/query_key` [query; key] and a Q5
`attention/gate_value` [gate; value] parent, Q5 output; per GDN layer a Q4 `gdn/query_key`, a Q5
`gdn/value_z`, Q5 output, bf16 a / b projections, tap-major convolution, fp32 `a_log` / `dt_bias`;
Q4 `mlp/gate_up`, Q5 `mlp/down`; the MTP head in W8 with one `query_key_gate_value` parent) in the
v3 framing of its `artifact-container.md`: 32-byte header, the closed JSON directory (components
with their configs and frontend resources, objects, bindings of every logical parameter as element
ranges of the parents, uses, files), the payload from the next 4096-byte boundary, continuation
parts (`NINPRT`, payload at 4096) past `--part-limit` bytes per file (default 32 GB).

Weights are random and meaningless, drawn so a forward pass stays finite (the values of
`ninfer.artifact.synth_draw`): code bytes uniform (W8 codes in [-127, 127]; read from one random
pool at random offsets, see `Codes`), every fp16 group scale
0.02 * sqrt(3) / 7, bf16 projections N(0, 0.02), norm offsets N(0, 0.1), plain-weight norms and
`dt_bias` around 1, A = exp(a_log) uniform in [1, 16). The tokenizer (built from the public BPE
ranks), the registered chat template and the released stop ids are the resources. Everything is
written in chunks of at most 64 MiB: a 16 GB file needs neither 16 GB of memory nor minutes of
CPU (the disk sets the pace).

`--layers N` writes the first N layers with the same per-layer shapes (the text config says N
layers). The framing is written here from the documents, sharing nothing with the reader.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CHUNK = 64 << 20
ENTRY_MAGIC = b"NINFER\x00\x03"
PART_MAGIC = b"NINPRT\x00\x03"
PAGE = 4096
TENSOR_ALIGN = 256
DEFAULT_LIMIT = 32_000_000_000
SCALE = 0.02 * 3**0.5 / 7  # synth_draw's group scale: weights about N(0, 0.02) for Q4 codes
# (v3 name, code bits, lanes per fp16 scale)
GROUPWISE = {"q4": ("q4_g64_fp16", 4, 64), "q5": ("q5_g64_fp16", 5, 64), "q6": ("q6_g64_fp16", 6, 64),
             "w8": ("q8_g32_fp16", 8, 32)}  # fmt: skip
DIRECT = {"bf16": ("bf16", 2), "fp32": ("fp32", 4)}
# a test-only geometry (`--tiny`): the real vocabulary, everything else small
TINY: dict[str, Any] = {
    "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 128, "intermediate_size": 256,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
    "num_hidden_layers": 4, "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0,
    "partial_rotary_factor": 0.25, "mrope_section": [3, 3, 2], "mrope_interleaved": True},
}  # fmt: skip


def align(x: int, a: int) -> int:
    return -(-x // a) * a


# ----------------------------------------------------------------------------------------- objects
@dataclass
class Obj:
    """One directory object: a tensor (`fmt` a key of GROUPWISE / DIRECT, `draw` its values' kind)
    or a resource (`data`)."""

    id: str
    shape: tuple[int, ...] = ()
    fmt: str = ""
    draw: str = ""  # direct tensors: proj | offset | one | alog
    data: bytes = b""
    offset: int = 0

    @property
    def resource(self) -> bool:
        return not self.fmt

    @property
    def nbytes(self) -> int:
        if self.resource:
            return len(self.data)
        if self.fmt in DIRECT:
            return math.prod(self.shape) * DIRECT[self.fmt][1]
        base, high, groups = self.planes()
        return align(base, TENSOR_ALIGN) + align(high, TENSOR_ALIGN) + 2 * groups

    def planes(self) -> tuple[int, int, int]:
        """row_split_k128_v1 of [N, K]: (base bytes, high-bit bytes, scale count)."""
        _, bits, group = GROUPWISE[self.fmt]
        n, k = self.shape
        groups = n * (align(k, 128) // group)
        high = groups * group * (bits - 4) // 8 if bits in (5, 6) else 0
        return groups * 32, high, groups

    def describe(self) -> dict[str, Any]:
        if self.resource:
            return {"id": self.id, "kind": "resource", "encoding": "raw_bytes_v1", "offset": self.offset,
                    "bytes": self.nbytes}  # fmt: skip
        fmt = GROUPWISE[self.fmt][0] if self.fmt in GROUPWISE else DIRECT[self.fmt][0]
        layout = "row_split_k128_v1" if self.fmt in GROUPWISE else "contiguous_le_v1"
        return {"id": self.id, "kind": "tensor", "shape": list(self.shape), "format": fmt, "layout": layout,
                "offset": self.offset, "bytes": self.nbytes}  # fmt: skip


class Inventory:
    """Objects in writer order, the bindings of logical parameters onto them, and their uses."""

    def __init__(self) -> None:
        self.objects: list[Obj] = []
        self.bindings: dict[str, Any] = {}
        self.uses: list[dict[str, Any]] = []

    def add(self, obj: Obj) -> Obj:
        self.objects.append(obj)
        return obj

    def whole(self, logical: str, obj: Obj, use: str | None = None) -> None:
        self.bindings[logical] = {"object": obj.id}
        if use is not None:
            self.uses.append({"parameter": logical, "input": use, "activation_policy": "A16Only"})

    def rows(self, obj: Obj, split: list[tuple[str, int]], use: str) -> None:
        """Bind consecutive row blocks of a fused parent, in order, as logical parameters."""
        k, r = obj.shape[1], 0
        for logical, n in split:
            self.bindings[logical] = {"parts": [{"object": obj.id, "range": [r * k, (r + n) * k]}]}
            self.uses.append({"parameter": logical, "input": use, "activation_policy": "A16Only"})
            r += n
        assert r == obj.shape[0], (obj.id, r, obj.shape)


def _layer(inv: Inventory, hf: dict[str, Any], p: str, full: bool, mat: Callable[[str], str]) -> None:
    """One decoder layer under prefix `p` (`text/layers/3/`, `mtp/layers/0/`); `mat(role)` its
    matrices' formats."""
    h, hd, i = hf["hidden_size"], hf["head_dim"], hf["intermediate_size"]
    q, kv = hf["num_attention_heads"] * hd, hf["num_key_value_heads"] * hd
    bf = "bf16"
    inv.whole(p + "input_norm", inv.add(Obj(p + "input_norm", (h,), bf, "offset")))
    mixer = p + "mixer_input"
    if full:
        a = p + "attention/"
        if mat("query") == mat("gate"):  # one [query; key; gate; value] parent (the MTP layer)
            o = inv.add(Obj(a + "query_key_gate_value", (2 * (q + kv), h), mat("query"), "proj"))
            inv.rows(o, [(a + "query", q), (a + "key", kv), (a + "gate", q), (a + "value", kv)], mixer)
        else:
            o = inv.add(Obj(a + "query_key", (q + kv, h), mat("query"), "proj"))
            inv.rows(o, [(a + "query", q), (a + "key", kv)], mixer)
            o = inv.add(Obj(a + "gate_value", (q + kv, h), mat("gate"), "proj"))
            inv.rows(o, [(a + "gate", q), (a + "value", kv)], mixer)
        for norm in ("query_norm", "key_norm"):
            inv.whole(a + norm, inv.add(Obj(a + norm, (hd,), bf, "offset")))
        inv.whole(a + "output", inv.add(Obj(a + "output", (h, q), mat("output"), "proj")), a + "output_input")
    else:
        g = p + "gdn/"
        kd = hf["linear_num_key_heads"] * hf["linear_key_head_dim"]
        nv, vhd = hf["linear_num_value_heads"], hf["linear_value_head_dim"]
        vd = nv * vhd
        inv.whole(g + "a_log", inv.add(Obj(g + "a_log", (nv,), "fp32", "alog")))
        inv.whole(g + "dt_bias", inv.add(Obj(g + "dt_bias", (nv,), "fp32", "one")))
        taps = hf["linear_conv_kernel_dim"]
        inv.whole(g + "convolution", inv.add(Obj(g + "convolution", (taps, 2 * kd + vd), bf, "proj")))
        for ab in ("a_projection", "b_projection"):
            inv.whole(g + ab, inv.add(Obj(g + ab, (nv, h), bf, "proj")), mixer)
        o = inv.add(Obj(g + "query_key", (2 * kd, h), mat("gdn_qk"), "proj"))
        inv.rows(o, [(g + "query", kd), (g + "key", kd)], mixer)
        o = inv.add(Obj(g + "value_z", (2 * vd, h), mat("gdn_vz"), "proj"))
        inv.rows(o, [(g + "value", vd), (g + "z", vd)], mixer)
        inv.whole(g + "norm", inv.add(Obj(g + "norm", (vhd,), bf, "one")))
        inv.whole(
            g + "output", inv.add(Obj(g + "output", (h, vd), mat("output"), "proj")), g + "output_input"
        )
    inv.whole(p + "post_attention_norm", inv.add(Obj(p + "post_attention_norm", (h,), bf, "offset")))
    m = p + "mlp/"
    o = inv.add(Obj(m + "gate_up", (2 * i, h), mat("mlp_in"), "proj"))
    inv.rows(o, [(m + "gate", i), (m + "up", i)], p + "mlp_input")
    inv.whole(m + "down", inv.add(Obj(m + "down", (h, i), mat("mlp_down"), "proj")), m + "down_input")


# the seed's 27B groupwise-int recipe by role (its qwen3.6-27b artifact reference, section 3.1)
DENSE_27B = {"query": "q4", "gate": "q5", "output": "q5", "gdn_qk": "q4", "gdn_vz": "q5", "mlp_in": "q4",
             "mlp_down": "q5", "embed": "q6", "head": "q6"}  # fmt: skip


def inventory(hf: dict[str, Any], resources: dict[str, bytes], mtp: bool) -> tuple[Inventory, dict[str, Any]]:
    """Every object, binding and use of a dense model of text config `hf`; returns it with the
    directory's `components`."""
    if hf.get("num_experts"):
        raise SystemExit("seed_synth: only the dense 27B groupwise-int layout is written (not MoE)")
    inv = Inventory()
    text_res = {}
    for role, data in resources.items():
        text_res[role] = inv.add(Obj("frontend/" + role, data=data)).id
    h, v = hf["hidden_size"], hf["vocab_size"]
    inv.whole(
        "text/token_embedding", inv.add(Obj("text/token_embedding", (v, h), DENSE_27B["embed"], "proj"))
    )
    for n, kind in enumerate(hf["layer_types"]):
        _layer(inv, hf, f"text/layers/{n}/", kind == "full_attention", DENSE_27B.__getitem__)
    inv.whole("text/final_norm", inv.add(Obj("text/final_norm", (h,), "bf16", "offset")))
    head = inv.add(Obj("text/output_head", (v, h), DENSE_27B["head"], "proj"))
    inv.whole("text/output_head", head, "text/output_head_input")
    components: dict[str, Any] = {"text": {"config": hf, "resources": text_res}}
    if mtp:
        inv.whole("mtp/input_projection", inv.add(Obj("mtp/input_projection", (h, 2 * h), "w8", "proj")),
                  "mtp/projection_input")  # fmt: skip
        for norm in ("embedding_norm", "hidden_norm"):
            inv.whole("mtp/" + norm, inv.add(Obj("mtp/" + norm, (h,), "bf16", "offset")))
        _layer(inv, hf, "mtp/layers/0/", True, lambda role: "w8")
        inv.whole("mtp/final_norm", inv.add(Obj("mtp/final_norm", (h,), "bf16", "offset")))
        components["mtp"] = {"config": {"architectures": ["Qwen3_5MTP"]}, "target": "text"}
    cursor = 0
    for o in inv.objects:
        o.offset = cursor if o.resource else align(cursor, TENSOR_ALIGN)
        cursor = o.offset + o.nbytes
    return inv, components


# ----------------------------------------------------------------------------------------- values
def _direct(o: Obj, rng: np.random.Generator) -> bytes:
    """A small direct tensor's little-endian words (bf16 by truncating fp32 after rounding)."""
    n = math.prod(o.shape)
    if o.draw == "alog":
        x = np.log(rng.uniform(1.0, 16.0, n))
    elif o.draw == "one":
        x = 1.0 + 0.1 * rng.standard_normal(n)
    else:
        x = (0.1 if o.draw == "offset" else 0.02) * rng.standard_normal(n)
    x32 = x.astype("<f4")
    if o.fmt == "fp32":
        return x32.tobytes()
    u = x32.view("<u4").astype(np.uint64)
    bf = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")  # round to nearest even
    return bf.tobytes()


class Codes:
    """Random code bytes at memory speed: one pool of CHUNK + 1 MiB random bytes drawn once (and a
    W8 copy without 0x80, since -128 is not a W8 code); each chunk is the pool read from a random
    offset (the codes repeat at random shifts: they only need to be random-looking and finite)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        pool = np.frombuffer(rng.bytes(CHUNK + (1 << 20)), np.uint8)
        w8 = pool.copy()
        w8[w8 == 0x80] = 0x81
        self.pools = {False: memoryview(pool.tobytes()), True: memoryview(w8.tobytes())}

    def take(self, n: int, w8: bool) -> memoryview:
        assert n <= CHUNK
        at = int(self.rng.integers(0, (1 << 20) + CHUNK - n + 1))
        return self.pools[w8][at : at + n]


def _stream(o: Obj, rng: np.random.Generator, codes: Codes) -> Iterator[bytes | memoryview]:
    """An object's encoded bytes, in chunks of at most CHUNK bytes."""
    if o.resource:
        yield o.data
        return
    if o.fmt in DIRECT:
        yield _direct(o, rng)
        return
    base, high, groups = o.planes()
    w8 = GROUPWISE[o.fmt][1] == 8
    for n in range(0, base, CHUNK):
        yield codes.take(min(CHUNK, base - n), w8)
    yield bytes(align(base, TENSOR_ALIGN) - base)
    for n in range(0, high, CHUNK):
        yield codes.take(min(CHUNK, high - n), False)
    yield bytes(align(high, TENSOR_ALIGN) - high)
    scale = memoryview(np.full(min(groups, CHUNK // 2), SCALE, "<f2").tobytes())
    for n in range(0, groups, CHUNK // 2):
        yield scale[: 2 * min(CHUNK // 2, groups - n)]


# ----------------------------------------------------------------------------------------- framing
def _files(entry: Path, payload: int, payload_start: int, limit: int) -> list[dict[str, Any]]:
    """The `files` table: the entry alone when it fits under `limit`, else full parts of the
    documented capacities (4096-byte multiples) and a last one with the rest."""
    if payload_start + payload <= limit:
        return [{"path": None, "payload_bytes": payload}]
    first, cap = (limit - payload_start) // PAGE * PAGE, (limit - PAGE) // PAGE * PAGE
    if first <= 0 or cap <= 0:
        raise SystemExit(f"seed_synth: --part-limit {limit} cannot hold the headers")
    files, rest = [{"path": None, "payload_bytes": first}], payload - first
    while rest > 0:
        files.append({"path": f"{entry.name}.part-{len(files):04d}", "payload_bytes": min(cap, rest)})
        rest -= cap
    return files


class _Sink:
    """Writes the logical payload across the entry and its parts at the `files` table's splits."""

    def __init__(self, entry: Path, files: list[dict[str, Any]], head: bytes, artifact_id: bytes) -> None:
        self.entry, self.files, self.artifact_id = entry, files, artifact_id
        self.index, self.left = 0, files[0]["payload_bytes"]
        self.f: BinaryIO = entry.open("wb")
        self.f.write(head)
        self.paths = [entry]

    def _next(self) -> None:
        self.f.close()
        self.index += 1
        path = self.entry.parent / self.files[self.index]["path"]
        self.paths.append(path)
        self.f = path.open("wb")
        part_head = PART_MAGIC + struct.pack("<Q", self.index) + self.artifact_id
        self.f.write(part_head + bytes(PAGE - len(part_head)))
        self.left = self.files[self.index]["payload_bytes"]

    def write(self, b: bytes | memoryview) -> None:
        view = memoryview(b)
        while len(view):
            if self.left == 0:
                self._next()
            n = min(self.left, len(view))
            self.f.write(view[:n])
            self.left -= n
            view = view[n:]

    def close(self) -> None:
        self.f.close()


def write(out: Path, hf: dict[str, Any], resources: dict[str, bytes], *, name: str, mtp: bool = True,
          seed: int = 0, limit: int = DEFAULT_LIMIT, provenance: dict[str, Any] | None = None) -> list[Path]:  # fmt: skip
    """Write the file set; returns its paths (the entry first)."""
    inv, components = inventory(hf, resources, mtp)
    payload = inv.objects[-1].offset + inv.objects[-1].nbytes
    root: dict[str, Any] = {
        "components": components,
        "objects": [o.describe() for o in inv.objects],
        "bindings": inv.bindings,
        "uses": inv.uses,
        "files": [],
        "metadata": {"name": name},
        "provenance": provenance or {},
    }
    # the files table's length moves the payload start: settle it with a fixed JSON reservation
    root["files"] = _files(out, payload, PAGE, limit)
    text = json.dumps(root, separators=(",", ":")).encode()
    reserve = align(32 + len(text) + 512, PAGE) - 32
    start = 32 + reserve
    root["files"] = _files(out, payload, start, limit)
    text = json.dumps(root, separators=(",", ":")).encode()
    assert len(text) <= reserve, "the files table outgrew the JSON reservation"
    text += b" " * (reserve - len(text))  # trailing JSON whitespace counts in json_bytes
    artifact_id = uuid.uuid4().bytes
    head = ENTRY_MAGIC + struct.pack("<Q", len(text)) + artifact_id + text
    rng = np.random.default_rng(seed)
    codes = Codes(rng)
    sink = _Sink(out, root["files"], head, artifact_id)
    try:
        cursor = 0
        for o in inv.objects:
            sink.write(bytes(o.offset - cursor))
            for chunk in _stream(o, rng, codes):
                sink.write(chunk)
            cursor = o.offset + o.nbytes
    finally:
        sink.close()
    for path, f, begin in zip(sink.paths, root["files"], [start] + [PAGE] * len(sink.paths), strict=False):
        if path.stat().st_size != begin + f["payload_bytes"]:
            raise SystemExit(
                f"seed_synth: {path} has {path.stat().st_size} bytes, not {begin + f['payload_bytes']}"
            )
    return sink.paths


# ----------------------------------------------------------------------------------------- model
def text_config(shape: str, layers: int | None, tiny: bool = False) -> dict[str, Any]:
    """The HF-style text config the `text` component carries (cut to `layers` layers)."""
    from ninfer.artifact.released import RELEASED_SHAPES

    if tiny:
        hf = dict(TINY)
    elif shape in RELEASED_SHAPES:
        hf = dict(RELEASED_SHAPES[shape])
    else:
        raise SystemExit(f"seed_synth: unknown shape {shape!r}; known: {', '.join(RELEASED_SHAPES)}")
    if layers is not None:
        if not 1 <= layers <= hf["num_hidden_layers"]:
            raise SystemExit(f"seed_synth: --layers must be in 1..{hf['num_hidden_layers']}, got {layers}")
        hf["num_hidden_layers"] = layers
    n = hf["num_hidden_layers"]
    hf["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
    return {"architectures": ["Qwen3_5ForCausalLM"], **hf, "tie_word_embeddings": False}


def frontend(model: str) -> dict[str, bytes]:
    """tokenizer.json (the public BPE ranks), the registered chat template and generation config."""
    from ninfer.artifact import registry
    from ninfer.artifact.released import RELEASED_GENERATION
    from ninfer.templates import read_template
    from ninfer.text.builder import cached_tokenizer_json

    ident = registry.lookup(model)
    assert ident is not None, model
    gen = {**RELEASED_GENERATION, "do_sample": True}
    return {
        "tokenizer.json": cached_tokenizer_json().read_bytes(),
        "chat_template.jinja": read_template(ident.template).encode(),
        "generation_config.json": json.dumps(gen, indent=2).encode(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", default="qwen3.6-27b", help="a released dense shape (qwen3.6-27b)")
    ap.add_argument("--layers", type=int, default=None, help="only the first N layers (config says N)")
    ap.add_argument("--no-mtp", action="store_true", help="leave out the MTP component")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--part-limit", type=int, default=DEFAULT_LIMIT, help="bytes per file (32 GB)")
    ap.add_argument("--force", action="store_true", help="replace an existing file")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests: a small geometry
    args = ap.parse_args(argv)
    if args.out.exists() and not args.force:
        raise SystemExit(f"seed_synth: {args.out} exists (--force replaces it)")
    t0 = time.perf_counter()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    hf = text_config(args.shape, args.layers, args.tiny)
    cut = "" if args.layers is None else f", first {args.layers} layers"
    name = "seed-synth-tiny" if args.tiny else args.shape
    prov = {"source": f"synthetic random weights of {args.shape}{cut} (ops/bench/seed_synth.py, seed {args.seed})",
            "recipe": "groupwise-int"}  # fmt: skip
    paths = write(args.out, hf, frontend(args.shape), name=name, mtp=not args.no_mtp, seed=args.seed,
                  limit=args.part_limit, provenance=prov)  # fmt: skip
    size = sum(p.stat().st_size for p in paths)
    print(f"wrote {args.out} ({len(paths)} file(s), {size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
