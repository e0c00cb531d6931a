"""A writer of the seed system's `.ninfer` container (v2 / v3) for tests, written from its documents
(`artifact-container.md`, `storage-layouts.md`, `tensor-formats.md`, the 27B / 35B-A3B artifact
references). It imports nothing from `ninfer` (no shared code with the reader): its own encoders
(MAXABS groupwise, an NVFP4 import with a max-abs divisor, row-scaled FP8), its own plane packing,
NVFP4 scale swizzle, framing, part splitting and bindings.

`build(hf_dir, out, version, recipe)` turns a tiny Hugging Face Qwen3.5 checkpoint (dense, or MoE
with the "moe" recipe: the 35B-A3B's parents and formats; a VL checkpoint adds its vision tower in
the seed's inventory and formats) into a seed file and returns the dequantized weights under the checkpoint's names (fp32), for
transformers to run as the reference. `dflash=(config, tensors)` adds a DFlash companion from a
drafter checkpoint (its config.json and tensors under its names) as the 35B-A3B reference §8 /
§13.3 writes it: W8 matrices, [q ; k ; v] and [gate ; up] parents, bf16 norms; v3 a `dflash`
component with that config and the parents' rows bound as `attention/{query,key,value}`,
`mlp/{gate,up}`."""

from __future__ import annotations

import json
import math
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

V2_FMT = {"bf16": "BF16", "fp32": "FP32", "int32": "I32", "q4": "Q4G64_F16S", "q5": "Q5G64_F16S",
          "q6": "Q6G64_F16S", "q8": "W8G32_F16S", "nvfp4": "NVFP4", "fp8row": "FP8_E4M3FN_ROW_BF16S"}  # fmt: skip
V3_FMT = {"bf16": "bf16", "fp32": "fp32", "int32": "int32", "q4": "q4_g64_fp16", "q5": "q5_g64_fp16",
          "q6": "q6_g64_fp16", "q8": "q8_g32_fp16", "nvfp4": "nvfp4", "fp8row": "fp8_e4m3fn_row_bf16"}  # fmt: skip
V2_LAY = {"direct": "contiguous-le-v1", "group": "row-split-k128-v1", "nvfp4": "blockscale-k16-m128x4-v1",
          "fp8row": "row-scale-v1"}  # fmt: skip
V3_LAY = {"direct": "contiguous_le_v1", "group": "row_split_k128_v1", "nvfp4": "block_scale_k16_m128x4_v1",
          "fp8row": "row_scale_v1"}  # fmt: skip
BITS = {"q4": 4, "q5": 5, "q6": 6, "q8": 8}
E2M1_POS = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


# ----------------------------------------------------------------------------------------- encoders
def enc_direct(x: torch.Tensor, fmt: str) -> tuple[bytes, torch.Tensor]:
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32, "int32": torch.int32}[fmt]
    y = x.to(dt).contiguous()
    return y.view(torch.uint8).numpy().tobytes() if y.numel() else b"", y.float() if fmt != "int32" else y


def enc_group(w: torch.Tensor, fmt: str) -> tuple[bytes, torch.Tensor]:
    """MAXABS_F16_RECIP_RNE_V1 + row-split-k128-v1 planes; returns (payload, dequantized fp32)."""
    bits = BITS[fmt]
    g = 32 if bits == 8 else 64
    qmax = (1 << (bits - 1)) - 1 if bits < 8 else 127
    n, k = w.shape
    kp = _up(k, 128)
    x = torch.zeros(n, kp)
    x[:, :k] = w.float()
    xg = x.view(n, kp // g, g)
    amax = xg.abs().amax(-1)
    s16 = (amax / qmax).half()
    s16 = torch.where((s16 == 0) & (amax > 0), torch.tensor(2.0**-24).half(), s16)
    s32 = s16.float()
    inv = torch.where(s32 > 0, 1.0 / torch.where(s32 > 0, s32, 1.0), 0.0)
    q = torch.round(xg * inv[..., None]).clamp(-qmax - (1 if bits < 8 else 0), qmax).to(torch.int64)
    deq = (q.float() * s32[..., None]).view(n, kp)[:, :k]
    u = (q & ((1 << bits) - 1)).view(n, kp)
    if bits == 8:
        base = u.to(torch.uint8)
    else:
        lo = u & 0xF
        base = (lo[:, 0::2] | (lo[:, 1::2] << 4)).to(torch.uint8)
    hb = bits - 4 if bits in (5, 6) else 0
    high = b""
    if hb:
        hv = (u >> 4) & ((1 << hb) - 1)  # lane-major bit stream, bit t -> byte t // 8, bit t % 8
        bitstream = torch.stack([(hv >> b) & 1 for b in range(hb)], -1).reshape(n, -1)
        weights = 2 ** torch.arange(8)
        high = (bitstream.view(n, -1, 8) * weights).sum(-1).to(torch.uint8).numpy().tobytes()
    b = base.numpy().tobytes()
    out = b + bytes(_up(len(b), 256) - len(b))
    out += high + bytes(_up(len(high), 256) - len(high))
    out += s16.contiguous().view(torch.uint8).numpy().tobytes()
    return out, deq


def enc_nvfp4(w: torch.Tensor) -> tuple[bytes, torch.Tensor]:
    """Codes: nearest E2M1 of x * d / s; block scale s: E4M3FN(max|x*d| / 6); divisor d = 448*6/max|x|."""
    n, k = w.shape
    x = w.float()
    d = torch.tensor(448.0 * 6.0 / float(x.abs().max()), dtype=torch.float32)
    xs = (x * d).view(n, k // 16, 16)
    s8 = (xs.abs().amax(-1) / 6.0).to(torch.float8_e4m3fn)
    s = s8.float()
    r = xs / torch.where(s > 0, s, 1.0)[..., None]
    idx = (r.abs()[..., None] - E2M1_POS).abs().argmin(-1)  # nearest magnitude
    code = (idx | ((r < 0).long() << 3)).view(n, k)
    val = torch.where(code >= 8, -E2M1_POS[code & 7], E2M1_POS[code & 7])
    deq = (val * s.repeat_interleave(16, 1)) / d
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8).numpy().tobytes()
    swz = bytearray(n * k // 16)
    sb = s8.view(torch.uint8)
    for row in range(n):
        for grp in range(k // 16):
            off = (
                ((row // 128) * (k // 64) + grp // 4) * 512
                + (row % 128 % 32) * 16
                + (row % 128 // 32) * 4
                + grp % 4
            )
            swz[off] = int(sb[row, grp])
    out = packed + bytes(_up(len(packed), 256) - len(packed)) + bytes(swz) + struct.pack("<f", float(d))
    return out, deq


def enc_fp8row(w: torch.Tensor) -> tuple[bytes, torch.Tensor]:
    s = (w.float().abs().amax(1) / 448.0).to(torch.bfloat16)
    s = torch.where(s.float() > 0, s, torch.ones_like(s))
    c = (w.float() / s.float()[:, None]).to(torch.float8_e4m3fn)
    deq = c.float() * s.float()[:, None]
    b = c.view(torch.uint8).numpy().tobytes()
    return b + bytes(_up(len(b), 256) - len(b)) + s.view(torch.uint8).numpy().tobytes(), deq


def encode(x: torch.Tensor, fmt: str) -> tuple[bytes, torch.Tensor]:
    if fmt in BITS:
        return enc_group(x, fmt)
    if fmt == "nvfp4":
        return enc_nvfp4(x)
    if fmt == "fp8row":
        return enc_fp8row(x)
    return enc_direct(x, fmt)


def layout_kind(fmt: str) -> str:
    return "group" if fmt in BITS else fmt if fmt in ("nvfp4", "fp8row") else "direct"


# ----------------------------------------------------------------------------------------- writer
@dataclass
class Obj:
    name: str
    kind: str
    data: bytes
    shape: list[int] = field(default_factory=list)
    fmt: str = ""
    rows: list[tuple[str, int]] = field(default_factory=list)  # v3 bindings: (logical, rows) of a parent
    logical: str = ""  # v3 binding of a whole object named otherwise than the object (moe/shared/down)


def _directory_objects(objs: list[Obj], version: int) -> tuple[list[dict[str, Any]], int]:
    out, cursor = [], 0
    key = "name" if version == 2 else "id"
    for o in objs:
        a = 256 if o.kind == "tensor" else 1
        off = _up(cursor, a)
        d: dict[str, Any] = {key: o.name, "kind": o.kind}
        if o.kind == "tensor":
            lay = layout_kind(o.fmt)
            d.update(
                shape=o.shape,
                format=(V2_FMT if version == 2 else V3_FMT)[o.fmt],
                layout=(V2_LAY if version == 2 else V3_LAY)[lay],
            )
        else:
            d["encoding"] = "raw-bytes-v1" if version == 2 else "raw_bytes_v1"
        d.update(offset=off, bytes=len(o.data))
        out.append(d)
        cursor = off + len(o.data)
    return out, cursor


def _payload(objs: list[Obj], directory: list[dict[str, Any]], total: int) -> bytearray:
    buf = bytearray(total)
    for o, d in zip(objs, directory, strict=True):
        buf[d["offset"] : d["offset"] + len(o.data)] = o.data
    return buf


def write_v2(path: Path, objs: list[Obj], model_id: str, weights_id: str) -> None:
    directory, total = _directory_objects(objs, 2)
    js = json.dumps(
        {"identity": {"model_id": model_id, "weights_id": weights_id}, "objects": directory}
    ).encode()
    start = _up(16 + len(js), 4096)
    with path.open("wb") as f:
        f.write(b"NINFER\x00\x02" + struct.pack("<Q", len(js)) + js + bytes(start - 16 - len(js)))
        f.write(_payload(objs, directory, total))


def bindings_of(objs: list[Obj]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for o in objs:
        if o.kind != "tensor":
            continue
        if not o.rows:  # the logical name is the object's, the MTP block renamed as v3 names it
            out[o.logical or o.name.replace("mtp/layer/", "mtp/layers/0/")] = {"object": o.name}
            continue
        width = o.shape[1] if len(o.shape) > 1 else 1
        cur = 0
        for logical, r in o.rows:
            out[logical] = {"parts": [{"object": o.name, "range": [cur * width, (cur + r) * width]}]}
            cur += r
    return out


def write_v3(
    path: Path, objs: list[Obj], components: dict[str, Any], *, limit: int = 32_000_000_000,
    metadata: dict[str, Any] | None = None, uses: list[dict[str, Any]] | None = None,
) -> list[Path]:  # fmt: skip
    """Entry + `.part-NNNN` files split at `limit` bytes per file (objects may straddle parts)."""
    directory, total = _directory_objects(objs, 3)
    bindings = bindings_of(objs)
    root: dict[str, Any] = {
        "components": components,
        "objects": directory,
        "bindings": bindings,
        "uses": uses
        if uses is not None
        else [{"parameter": n, "input": "x", "activation_policy": "A16Only"} for n in bindings],
        "metadata": metadata or {},
    }
    reserve = 4096 - 32
    while True:
        start = 32 + reserve
        if start + total <= limit:
            files = [{"path": None, "payload_bytes": total}]
        else:
            first, cap = (limit - start) // 4096 * 4096, (limit - 4096) // 4096 * 4096
            files, rest = [{"path": None, "payload_bytes": first}], total - first
            while rest:
                files.append({"path": f"{path.name}.part-{len(files):04d}", "payload_bytes": min(rest, cap)})
                rest -= min(rest, cap)
        root["files"] = files
        js = json.dumps(root, separators=(",", ":")).encode()
        if len(js) <= reserve:
            js += b" " * (reserve - len(js))
            break
        reserve = _up(32 + len(js) + 512, 4096) - 32  # room for later edits of the directory
    aid = uuid.uuid4().bytes
    payload = _payload(objs, directory, total)
    out, cursor = [], 0
    for i, f in enumerate(files):
        p = path if i == 0 else path.parent / f["path"]
        head = (b"NINFER\x00\x03" + struct.pack("<Q", len(js)) + aid + js) if i == 0 else (
            b"NINPRT\x00\x03" + struct.pack("<Q", i) + aid + bytes(4096 - 32))  # fmt: skip
        with p.open("wb") as fh:
            fh.write(head)
            if i == 0:
                fh.write(bytes(start - len(head)))
            fh.write(payload[cursor : cursor + f["payload_bytes"]])
        cursor += f["payload_bytes"]
        out.append(p)
    return out


# ----------------------------------------------------------------------------------------- recipes
RECIPES = {
    # the 27B groupwise-int contract: two-parent attention, [q,k] / [v,z] GDN parents
    "groupwise": {"embed": "q6", "head": "q6", "qk": "q4", "gv": "q5", "o": "q5", "gqk": "q4", "gvz": "q5",
                  "go": "q5", "gate_up": "q4", "down": "q5", "mtp": "q8"},
    # an NVFP4 contract: single-parent attention, NVFP4 where N % 128 == 0, row FP8 elsewhere
    "nvfp4": {"embed": "q8", "head": "nvfp4", "qkgv": "nvfp4", "o": "fp8row", "gqkvz": "bf16", "go": "fp8row",
              "gate_up": "nvfp4", "down": "fp8row", "mtp": "q8"},
    # the 35B-A3B groupwise-int contract: W8 attention / GDN / shared experts / embedding, routed
    # gate/up Q4, routed down Q5 (Q6 on the last layer), head Q6, [a, b] and router parents bf16
    "moe": {"embed": "q8", "head": "q6", "qkgv": "q8", "o": "q8", "gqkvz": "q8", "go": "q8", "ab_fused": "bf16",
            "routed_gate_up": "q4", "routed_down": "q5", "routed_down_last": "q6", "shared": "q8", "mtp": "q8"},
}  # fmt: skip


def build(
    hf_dir: Path, out: Path, version: int, recipe: str, *, model_id: str = "tiny-seed", limit: int = 32_000_000_000,
    tokenizer: bytes = b"{}", template: str = "{{ messages }}", formats: dict[str, str] | None = None,
    proposal: int = 0, dflash: tuple[dict[str, Any], dict[str, torch.Tensor]] | None = None,
) -> tuple[list[Path], dict[str, torch.Tensor]]:  # fmt: skip
    """A seed file of a tiny dense or MoE checkpoint; (files written, dequantized weights by HF name).
    `formats` replaces entries of the recipe (e.g. a bf16 embedding and head for a full vocabulary).
    `proposal` rows: an indexed proposal head (`text/draft_head` Q4, the output-head rows of distinct
    random ids, and `text/draft_head_token_ids` int32; `lm_head_draft.*` in the returned weights).
    `dflash`: the companion (`dflash.` + the drafter checkpoint's names in the returned weights)."""
    r = {**RECIPES[recipe], **(formats or {})}
    cfg = json.loads((hf_dir / "config.json").read_text())
    text = cfg.get("text_config") or cfg
    sd: dict[str, torch.Tensor] = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        sd.update(load_file(f))
    vl = "vision_config" in cfg  # a VL checkpoint: text under model.language_model., vision model.visual.
    if vl:
        sd = {k.replace("model.language_model.", "model.", 1): t for k, t in sd.items()}
    h, hd, nh, nkv = (
        text["hidden_size"],
        text["head_dim"],
        text["num_attention_heads"],
        text["num_key_value_heads"],
    )
    kd = text["linear_num_key_heads"] * text["linear_key_head_dim"]
    vd = text["linear_num_value_heads"] * text["linear_value_head_dim"]
    moe = "num_experts" in text
    inter = text.get("intermediate_size")
    if moe:
        e, ie, si = (
            text["num_experts"],
            text["moe_intermediate_size"],
            text["shared_expert_intermediate_size"],
        )
    n_layers = text["num_hidden_layers"]
    objs: list[Obj] = []
    ref: dict[str, torch.Tensor] = {}
    gen = (hf_dir / "generation_config.json").read_bytes()
    res = {"tokenizer.json": tokenizer, "tokenizer_config.json": b'{"add_bos_token": false}',
           "chat_template.jinja": template.encode(), "generation_config.json": gen,
           "preprocessor_config.json": b'{"patch_size": 16}', "video_preprocessor_config.json": b'{"fps": 2}'}  # fmt: skip
    for role, data in res.items():
        objs.append(Obj("frontend/" + role, "resource", data))

    def put(name: str, x: torch.Tensor, fmt: str, rows: list[tuple[str, int]] | None = None) -> torch.Tensor:
        data, deq = encode(x, fmt)
        objs.append(Obj(name, "tensor", data, list(x.shape), fmt, rows or []))
        return deq

    def split(deq: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        return list(torch.split(deq, sizes))

    def block(src: str, dst: str, logical: str, full: bool, mat: str | None = None) -> None:
        def m(role: str) -> str:
            return mat or r[role]

        ref[src + "input_layernorm.weight"] = put(
            dst + "input_norm", sd[src + "input_layernorm.weight"], "bf16"
        )
        if full:
            a = src + "self_attn."
            qg = sd[a + "q_proj.weight"].view(nh, 2, hd, h)
            q, g = qg[:, 0].reshape(nh * hd, h), qg[:, 1].reshape(nh * hd, h)
            k, v = sd[a + "k_proj.weight"], sd[a + "v_proj.weight"]
            if "qkgv" in r or mat:
                dq, dk, dg, dv = split(put(dst + "attention/query_key_gate_value", torch.cat([q, k, g, v]), m("qkgv"),
                    [(logical + "attention/" + n, s) for n, s in (("query", nh * hd), ("key", nkv * hd),
                                                                  ("gate", nh * hd), ("value", nkv * hd))]),
                    [nh * hd, nkv * hd, nh * hd, nkv * hd])  # fmt: skip
            else:
                dq, dk = split(put(dst + "attention/query_key", torch.cat([q, k]), r["qk"],
                                   [(logical + "attention/query", nh * hd), (logical + "attention/key", nkv * hd)]),
                               [nh * hd, nkv * hd])  # fmt: skip
                dg, dv = split(put(dst + "attention/gate_value", torch.cat([g, v]), r["gv"],
                                   [(logical + "attention/gate", nh * hd), (logical + "attention/value", nkv * hd)]),
                               [nh * hd, nkv * hd])  # fmt: skip
            ref[a + "q_proj.weight"] = torch.stack([dq.view(nh, hd, h), dg.view(nh, hd, h)], 1).reshape(
                2 * nh * hd, h
            )
            ref[a + "k_proj.weight"], ref[a + "v_proj.weight"] = dk, dv
            for ours, theirs in (("q_norm", "query_norm"), ("k_norm", "key_norm")):
                ref[a + ours + ".weight"] = put(dst + "attention/" + theirs, sd[a + ours + ".weight"], "bf16")
            ref[a + "o_proj.weight"] = put(dst + "attention/output", sd[a + "o_proj.weight"], m("o"))
        else:
            g_ = src + "linear_attn."
            qkv, z = sd[g_ + "in_proj_qkv.weight"], sd[g_ + "in_proj_z.weight"]
            ref[g_ + "A_log"] = put(dst + "gdn/a_log", sd[g_ + "A_log"], "fp32")
            ref[g_ + "dt_bias"] = put(dst + "gdn/dt_bias", sd[g_ + "dt_bias"], "fp32")
            conv = sd[g_ + "conv1d.weight"]  # [C, 1, taps] -> tap-major [taps, C]
            ref[g_ + "conv1d.weight"] = put(
                dst + "gdn/convolution", conv[:, 0, :].t().contiguous(), "bf16"
            ).t()[:, None, :]
            a_, b_ = sd[g_ + "in_proj_a.weight"], sd[g_ + "in_proj_b.weight"]
            if r.get("ab_fused"):  # the 35B-A3B's [a, b] parent
                nv = a_.shape[0]
                ref[g_ + "in_proj_a.weight"], ref[g_ + "in_proj_b.weight"] = split(
                    put(dst + "gdn/a_b_projection", torch.cat([a_, b_]), "bf16",
                        [(logical + "gdn/a_projection", nv), (logical + "gdn/b_projection", nv)]), [nv, nv])  # fmt: skip
            else:
                ref[g_ + "in_proj_a.weight"] = put(dst + "gdn/a_projection", a_, "bf16")
                ref[g_ + "in_proj_b.weight"] = put(dst + "gdn/b_projection", b_, "bf16")
            names = [
                (logical + "gdn/" + n, s) for n, s in (("query", kd), ("key", kd), ("value", vd), ("z", vd))
            ]
            if "gqkvz" in r:
                dqkv, dz = split(put(dst + "gdn/query_key_value_z", torch.cat([qkv, z]), r["gqkvz"], names),
                                 [2 * kd + vd, vd])  # fmt: skip
            else:
                dqk = put(dst + "gdn/query_key", qkv[: 2 * kd], r["gqk"], names[:2])
                dv, dz = split(
                    put(dst + "gdn/value_z", torch.cat([qkv[2 * kd :], z]), r["gvz"], names[2:]), [vd, vd]
                )
                dqkv = torch.cat([dqk, dv])
            ref[g_ + "in_proj_qkv.weight"], ref[g_ + "in_proj_z.weight"] = dqkv, dz
            ref[g_ + "norm.weight"] = put(dst + "gdn/norm", sd[g_ + "norm.weight"], "bf16")
            ref[g_ + "out_proj.weight"] = put(dst + "gdn/output", sd[g_ + "out_proj.weight"], m("go"))
        ref[src + "post_attention_layernorm.weight"] = put(
            dst + "post_attention_norm", sd[src + "post_attention_layernorm.weight"], "bf16"
        )
        p = src + "mlp."
        if moe:
            return moe_ffn(p, dst, logical, mat)
        gate, up = split(put(dst + "mlp/gate_up", torch.cat([sd[p + "gate_proj.weight"], sd[p + "up_proj.weight"]]),
                             m("gate_up"), [(logical + "mlp/gate", inter), (logical + "mlp/up", inter)]),
                         [inter, inter])  # fmt: skip
        ref[p + "gate_proj.weight"], ref[p + "up_proj.weight"] = gate, up
        ref[p + "down_proj.weight"] = put(dst + "mlp/down", sd[p + "down_proj.weight"], m("down"))

    def moe_ffn(p: str, dst: str, logical: str, mat: str | None) -> None:
        """35B-A3B: [router ; shared-expert gate] bf16, routed gate/up and down expert-major, shared
        [gate, up] and down; one W8 format for all of them in the MTP layer (`mat`)."""
        router, score = sd[p + "gate.weight"], sd[p + "shared_expert_gate.weight"]
        ref[p + "gate.weight"], ref[p + "shared_expert_gate.weight"] = split(
            put(dst + "moe/router_shared_gate", torch.cat([router, score]), "bf16",
                [(logical + "moe/router", e), (logical + "moe/shared_score", 1)]), [e, 1])  # fmt: skip
        if p + "experts.gate_up_proj" in sd:  # [E, 2I, H], [E, H, I]
            gu, dn = sd[p + "experts.gate_up_proj"], sd[p + "experts.down_proj"]
        else:  # save_pretrained writes one key per expert and projection
            x_ = p + "experts."
            gu = torch.stack(
                [
                    torch.cat([sd[f"{x_}{x}.gate_proj.weight"], sd[f"{x_}{x}.up_proj.weight"]])
                    for x in range(e)
                ]
            )
            dn = torch.stack([sd[f"{x_}{x}.down_proj.weight"] for x in range(e)])
        names = [(f"{logical}moe/experts/{x}/{n}", ie) for x in range(e) for n in ("gate", "up")]
        ref[p + "experts.gate_up_proj"] = put(
            dst + "moe/routed_gate_up", gu.reshape(e * 2 * ie, h), mat or r["routed_gate_up"], names
        ).view(e, 2 * ie, h)
        down_fmt = mat or r["routed_down_last" if p == f"model.layers.{n_layers - 1}.mlp." else "routed_down"]
        names = [(f"{logical}moe/experts/{x}/down", h) for x in range(e)]
        ref[p + "experts.down_proj"] = put(
            dst + "moe/routed_down", dn.reshape(e * h, ie), down_fmt, names
        ).view(e, h, ie)
        s_ = p + "shared_expert."
        ref[s_ + "gate_proj.weight"], ref[s_ + "up_proj.weight"] = split(
            put(dst + "moe/shared_gate_up", torch.cat([sd[s_ + "gate_proj.weight"], sd[s_ + "up_proj.weight"]]),
                mat or r["shared"], [(logical + "moe/shared/gate", si), (logical + "moe/shared/up", si)]),
            [si, si])  # fmt: skip
        ref[s_ + "down_proj.weight"] = put(
            dst + "moe/shared_down", sd[s_ + "down_proj.weight"], mat or r["shared"]
        )
        objs[-1].logical = logical + "moe/shared/down"

    def vision(vc: dict[str, Any]) -> None:
        """The tower (the 35B-A3B's inventory order and formats): qkv / fc1 Q4, output / fc2 Q5,
        patch Q6, merger W8, the rest bf16; qkv and its bias split [query, key, value] by binding."""
        v, hv = "model.visual.", vc["hidden_size"]
        pw = sd[v + "patch_embed.proj.weight"]
        ref[v + "patch_embed.proj.weight"] = put(
            "vision/patch_embedding", pw.reshape(pw.shape[0], -1), "q6"
        ).view(pw.shape)
        ref[v + "patch_embed.proj.bias"] = put(
            "vision/patch_embedding_bias", sd[v + "patch_embed.proj.bias"], "bf16"
        )
        ref[v + "pos_embed.weight"] = put("vision/position_embedding", sd[v + "pos_embed.weight"], "bf16")

        def linear(src: str, dst: str, fmt: str, rows: list[tuple[str, int]] | None = None) -> None:
            ref[src + ".weight"] = put(dst, sd[src + ".weight"], fmt, rows)
            ref[src + ".bias"] = put(
                dst + "_bias", sd[src + ".bias"], "bf16", [(n + "_bias", r) for n, r in rows or []]
            )

        def norm(src: str, dst: str) -> None:
            for part in ("weight", "bias"):
                ref[f"{src}.{part}"] = put(f"{dst}/{part}", sd[f"{src}.{part}"], "bf16")
                objs[-1].logical = f"{dst}_{part}"

        for b in range(vc["depth"]):
            s_, d = f"{v}blocks.{b}.", f"vision/layers/{b}/"
            linear(
                s_ + "attn.qkv",
                d + "attention/qkv",
                "q4",
                [(d + "attention/" + r, hv) for r in ("query", "key", "value")],
            )
            linear(s_ + "attn.proj", d + "attention/output", "q5")
            linear(s_ + "mlp.linear_fc1", d + "mlp/fc1", "q4")
            linear(s_ + "mlp.linear_fc2", d + "mlp/fc2", "q5")
            norm(s_ + "norm1", d + "norm1")
            norm(s_ + "norm2", d + "norm2")
        linear(v + "merger.linear_fc1", "vision/merger/fc1", "q8")
        linear(v + "merger.linear_fc2", "vision/merger/fc2", "q8")
        norm(v + "merger.norm", "vision/merger/norm")

    def companion(dsd: dict[str, torch.Tensor], mat: str) -> None:
        """§8's inventory in its order (after the vision merger): the feature projection, the
        context norm, each layer's eight objects, the final norm."""
        ref["dflash.fc.weight"] = put("dflash/feature_projection", dsd["fc.weight"], mat)
        ref["dflash.hidden_norm.weight"] = put("dflash/context_norm", dsd["hidden_norm.weight"], "bf16")
        n_draft = 1 + max(int(k.split(".")[1]) for k in dsd if k.startswith("layers."))
        for i in range(n_draft):
            s_, d, o = f"layers.{i}.", f"dflash/layers/{i}/", f"dflash.layers.{i}."
            ref[o + "input_layernorm.weight"] = put(
                d + "input_norm", dsd[s_ + "input_layernorm.weight"], "bf16"
            )
            qkv = [dsd[f"{s_}self_attn.{x}_proj.weight"] for x in "qkv"]
            rows = [t.shape[0] for t in qkv]
            names = [
                (d + "attention/" + n, r_) for n, r_ in zip(("query", "key", "value"), rows, strict=True)
            ]
            parts = split(put(d + "attention/query_key_value", torch.cat(qkv), mat, names), rows)
            for x, t in zip("qkv", parts, strict=True):
                ref[f"{o}self_attn.{x}_proj.weight"] = t
            for ours, theirs in (("q_norm", "query_norm"), ("k_norm", "key_norm")):
                ref[f"{o}self_attn.{ours}.weight"] = put(
                    d + "attention/" + theirs, dsd[f"{s_}self_attn.{ours}.weight"], "bf16"
                )
            ref[o + "self_attn.o_proj.weight"] = put(
                d + "attention/output", dsd[s_ + "self_attn.o_proj.weight"], mat
            )
            ref[o + "post_attention_layernorm.weight"] = put(
                d + "post_attention_norm", dsd[s_ + "post_attention_layernorm.weight"], "bf16"
            )
            gate, up = dsd[s_ + "mlp.gate_proj.weight"], dsd[s_ + "mlp.up_proj.weight"]
            ref[o + "mlp.gate_proj.weight"], ref[o + "mlp.up_proj.weight"] = split(
                put(d + "mlp/gate_up", torch.cat([gate, up]), mat,
                    [(d + "mlp/gate", gate.shape[0]), (d + "mlp/up", up.shape[0])]), [gate.shape[0], up.shape[0]])  # fmt: skip
            ref[o + "mlp.down_proj.weight"] = put(d + "mlp/down", dsd[s_ + "mlp.down_proj.weight"], mat)
        ref["dflash.norm.weight"] = put("dflash/final_norm", dsd["norm.weight"], "bf16")

    ref["model.embed_tokens.weight"] = put(
        "text/token_embedding", sd["model.embed_tokens.weight"], r["embed"]
    )
    for i, kind in enumerate(text["layer_types"]):
        block(f"model.layers.{i}.", f"text/layers/{i}/", f"text/layers/{i}/", kind == "full_attention")
    ref["model.norm.weight"] = put("text/final_norm", sd["model.norm.weight"], "bf16")
    ref["lm_head.weight"] = put("text/output_head", sd["lm_head.weight"], r["head"])
    if proposal:  # in the seed's order: unique ids, not sorted
        ids = torch.randperm(sd["lm_head.weight"].shape[0], generator=torch.Generator().manual_seed(17))[
            :proposal
        ]
        ref["lm_head_draft.weight"] = put("text/draft_head", sd["lm_head.weight"][ids], "q4")
        objs[-1].logical = "proposal/head"
        ref["lm_head_draft.token_ids"] = put("text/draft_head_token_ids", ids.to(torch.int32), "int32")
        objs[-1].logical = "proposal/token_ids"
    has_mtp = "mtp.fc.weight" in sd
    if has_mtp:
        ref["mtp.fc.weight"] = put("mtp/input_projection", sd["mtp.fc.weight"], r["mtp"])
        for ours, theirs in (
            ("pre_fc_norm_embedding", "embedding_norm"),
            ("pre_fc_norm_hidden", "hidden_norm"),
        ):
            ref[f"mtp.{ours}.weight"] = put(f"mtp/{theirs}", sd[f"mtp.{ours}.weight"], "bf16")
        block("mtp.layers.0.", "mtp/layer/", "mtp/layers/0/", True, mat=r["mtp"])
        ref["mtp.norm.weight"] = put("mtp/final_norm", sd["mtp.norm.weight"], "bf16")
    if vl:
        vision(cfg["vision_config"])
    if dflash is not None:
        companion(dflash[1], r.get("dflash", "q8"))
    if vl:
        ref = {
            k if k.startswith(("model.visual.", "lm_head", "mtp.")) else "model.language_model." + k[6:]: t
            for k, t in ref.items()
        }
    files = [out]
    if version == 2:
        write_v2(out, objs, model_id, "nvfp4" if recipe == "nvfp4" else "groupwise-int")
    else:
        text_cfg = {k: v for k, v in text.items() if k != "mtp_num_hidden_layers"}
        comps: dict[str, Any] = {
            "text": {"config": text_cfg, "resources": {n: "frontend/" + n for n in list(res)[:4]}},
            "vision": {"config": _vision_config(cfg.get("vision_config")), "target": "text",
                       "resources": {n: "frontend/" + n for n in list(res)[4:]}},
        }  # fmt: skip
        if proposal:
            comps["text"]["proposal"] = {"domain": "indexed", "rows": proposal}
        if has_mtp:
            arch = "Qwen3_5MoeMTP" if moe else "Qwen3_5MTP"
            comps["mtp"] = {"config": {"architectures": [arch]}, "target": "text"}
        if dflash is not None:
            comps["dflash"] = {"config": dflash[0], "target": "text"}
        files = write_v3(out, objs, comps, limit=limit, metadata={"name": model_id})
    return files, {k: v.float() for k, v in ref.items()}


def _vision_config(vc: dict[str, Any] | None) -> dict[str, Any]:
    """The v3 vision component's config as the seed writes it (no `out_hidden_size`)."""
    keys = ("depth", "hidden_size", "intermediate_size", "num_heads", "patch_size", "temporal_patch_size",
            "spatial_merge_size", "num_position_embeddings")  # fmt: skip
    return {"model_type": "qwen3_5_vision", **{k: vc[k] for k in keys if vc is not None}}


def elements(shape: list[int]) -> int:
    return math.prod(shape)
