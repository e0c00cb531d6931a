"""Quantized artifacts against transformers: a random checkpoint converted with each weight profile,
then its stored weights dequantized on the host (code x scale, with a decoder of its own here) and
loaded into transformers; the engine on the quantized artifact matches it as the bf16 path matches
bf16 (fp32 on the CPU: logits within 1e-4, greedy tokens equal). MTP speculative decoding on a
quantized artifact equals spec off; fused projections of mixed formats give the unfused outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from hf_fixtures import make_hf_checkpoint

from ninfer import LLM, SamplingParams
from ninfer.artifact import open_artifact
from ninfer.artifact.convert import convert
from ninfer.artifact.quant_store import plane_name
from ninfer.model.weights import load_model

PROFILES = ["groupwise-int", "fp8", "q4_g64", "q8_g32"]


def decode_plane_tensors(art) -> dict[str, torch.Tensor]:
    """Every text tensor as fp32, quantized ones decoded from their stored planes by this test's own
    reading of the formats (nibbles, high bits, fp16 / block scales), split parts merged back."""
    cfg = art.config
    raw = art._load_entries("text", "cpu")
    out = {n: t.float() for n, t in raw.items() if "#" not in n}
    for name, spec in art.quantized.get("text", {}).items():
        base = raw[plane_name(name, "base")]
        scale = raw[plane_name(name, "scale")].float()
        k = spec.shape[-1]
        if spec.fmt == "fp8_e4m3_b128":  # each expert's (or the matrix's) own 128 x 128 blocks
            n = spec.shape[-2]
            nb = -(-n // 128)
            experts = base.shape[0] // n
            w = torch.cat(
                [
                    base[e * n : (e + 1) * n].float()
                    * scale[e * nb : (e + 1) * nb]
                    .repeat_interleave(128, 0)[:n]
                    .repeat_interleave(128, 1)[:, :k]
                    for e in range(experts)
                ]
            )
        else:
            bits = int(spec.fmt[1])
            group = 32 if bits == 8 else 64
            if bits == 8:
                codes = base.view(torch.int8).long()
            else:
                b = base.long()
                u = torch.stack([b & 15, b >> 4], -1).flatten(1)
                if bits > 4:
                    h = raw[plane_name(name, "high")].long()
                    per = 8 // (bits - 4)  # lanes per high byte
                    shifts = torch.arange(per) * (bits - 4)
                    hb = ((h.unsqueeze(-1) >> shifts) & ((1 << (bits - 4)) - 1)).flatten(1)
                    u = u | (hb << 4)
                codes = torch.where(u >= 1 << (bits - 1), u - (1 << bits), u)
            w = codes.float() * scale.repeat_interleave(group, 1)
        out[name] = w[:, :k].reshape(spec.shape)
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        if p + "self_attn.query_proj.weight" in out:
            q, g = out.pop(p + "self_attn.query_proj.weight"), out.pop(p + "self_attn.gate_proj.weight")
            nh, hd = cfg.num_attention_heads, cfg.head_dim
            qg = torch.stack([q.view(nh, hd, -1), g.view(nh, hd, -1)], dim=1)  # per head [query ; gate]
            out[p + "self_attn.q_proj.weight"] = qg.reshape(2 * nh * hd, -1)
        if p + "linear_attn.in_proj_qk.weight" in out:
            qk, v = out.pop(p + "linear_attn.in_proj_qk.weight"), out.pop(p + "linear_attn.in_proj_v.weight")
            out[p + "linear_attn.in_proj_qkv.weight"] = torch.cat([qk, v])
    return out


@pytest.fixture(scope="module", params=["dense", "moe"])
def checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp(f"q-{request.param}")
    return request.param, make_hf_checkpoint(root / "hf", request.param, seed=3, with_mtp=True)


@pytest.mark.parametrize("profile", PROFILES)
def test_quantized_engine_matches_transformers_on_dequantized_weights(checkpoint, profile, tmp_path) -> None:
    kind, hf_dir = checkpoint
    out = convert(hf_dir, tmp_path / "q.ninfer", weights=profile)
    art = open_artifact(out)
    assert art.weight_profile == profile and art.quantized["text"]
    if profile == "groupwise-int" and kind == "dense":  # the 27B recipe splits query / gate and q|k / v
        assert "model.layers.3.self_attn.query_proj.weight" in art.quantized["text"]
        assert "model.layers.0.linear_attn.in_proj_qk.weight" in art.quantized["text"]
    hf = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, experts_implementation="eager"
    ).eval()
    prompt = torch.randint(
        0, hf.config.vocab_size, (90,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    with torch.no_grad():
        original = hf(torch.tensor([prompt])).logits[0]
        missing, unexpected = hf.load_state_dict(decode_plane_tensors(art), strict=False)
        assert not unexpected and all(m.startswith("mtp.") for m in missing)
        ref = hf(torch.tensor([prompt])).logits[0]
        ref_gen = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, pad_token_id=0)
    # the quantization changed the model (the comparison below is not of two bf16 models)
    assert (original - ref).abs().max() / ref.abs().max() > 1e-3
    llm = LLM(out)
    logits = llm.logits(prompt)
    assert (logits - ref).abs().max() / ref.abs().max() <= 1e-4
    got = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))[0]
    assert list(got.token_ids) == ref_gen[0, len(prompt) :].tolist()


def test_fused_mixed_formats_equal_unfused(checkpoint, tmp_path) -> None:
    """On the CPU a load keeps projections apart; fused (as on CUDA), the runs of one format become
    one weight each ([query | key] Q4, [gate | value] Q5 ...) and the outputs are the same."""
    kind, hf_dir = checkpoint
    art = open_artifact(convert(hf_dir, tmp_path / "q.ninfer", weights="groupwise-int"))
    tensors = art.load_tensors("text")
    plain = load_model(art.config, tensors, torch.float32, "cpu", fuse=False)
    fused = load_model(art.config, tensors, torch.float32, "cpu", fuse=True)
    groups = fused.layers[3].self_attn.__dict__["fused_groups"]
    if kind == "dense":
        assert sorted(g.parts for g in groups.values()) == [("gate_proj", "v_proj"), ("query_proj", "k_proj")]
    else:
        assert [g.parts for g in groups.values()] == [("q_proj", "k_proj", "v_proj")]
    prompt = list(range(5, 45))
    a = LLM.from_model(plain).logits(prompt)
    b = LLM.from_model(fused).logits(prompt)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(a.abs().max()))


def test_mtp_speculation_on_a_quantized_artifact_equals_spec_off(checkpoint, tmp_path) -> None:
    from types import SimpleNamespace

    from ninfer.bootstrap import load_spec_weights, spec_fields
    from tests.speculative.helpers import assert_speculation_exact

    _, hf_dir = checkpoint
    art = open_artifact(convert(hf_dir, tmp_path / "q.ninfer", weights="groupwise-int"))
    assert art.quantized["mtp"]  # the MTP matrices are W8
    spec = SimpleNamespace(method="mtp", draft_tokens=3, lm_head_draft=False)
    plain = load_model(art.config, art.load_tensors("text"), torch.float32, "cpu")
    spec_model = load_model(art.config, art.load_tensors("text"), torch.float32, "cpu")
    load_spec_weights(spec, art, spec_model, torch.float32, "cpu")
    assert_speculation_exact(plain, spec_model, None, **spec_fields(spec))


def _fp8_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """This test's own FP8 checkpoint writer: e4m3 codes and fp32 scale_inv per 128 x 128 block."""
    n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    scale = torch.ones(nb, kb)
    for i in range(nb):
        for j in range(kb):
            amax = w[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128].abs().max()
            scale[i, j] = amax / 448.0 if amax > 0 else 1.0
    full = scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return (w / full).clamp(-448, 448).to(torch.float8_e4m3fn), scale


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_an_fp8_checkpoint_converts_as_it_is(kind: str, tmp_path: Path) -> None:
    """A Hugging Face FP8 checkpoint (quantization_config fp8, weight + weight_scale_inv, some modules
    left unconverted; MoE experts per expert) converts without a pass through bf16: the artifact holds
    its codes and scales, and the engine equals transformers on the block-dequantized weights."""
    import json

    from safetensors.torch import load_file, save_file

    extra = {"moe_intermediate_size": 128} if kind == "moe" else {}  # expert gate | up at 128-row blocks
    hf_dir = make_hf_checkpoint(
        tmp_path / "hf", kind, seed=4, with_mtp=False, per_expert_keys=kind == "moe", **extra
    )
    fp8_dir = tmp_path / "fp8"
    fp8_dir.mkdir()
    state = load_file(hf_dir / "model.safetensors")
    out, dequantized, keep = (
        {},
        {},
        ["embed_tokens", "lm_head", "norm", "mlp.gate.", "shared_expert_gate", "in_proj_a", "in_proj_b"],
    )
    for name, t in state.items():
        if t.dim() == 2 and name.endswith("proj.weight") and not any(s in name for s in keep):
            codes, scale = _fp8_blocks(t.float())
            out[name], out[name + "_scale_inv"] = codes, scale
            full = scale.repeat_interleave(128, 0)[: t.shape[0]].repeat_interleave(128, 1)[:, : t.shape[1]]
            dequantized[name] = codes.float() * full
        else:
            out[name] = t
    save_file(out, str(fp8_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                  "activation_scheme": "dynamic", "modules_to_not_convert": keep}  # fmt: skip
    (fp8_dir / "config.json").write_text(json.dumps(cfg))
    for f in hf_dir.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            (fp8_dir / f.name).write_bytes(f.read_bytes())
    art = open_artifact(convert(fp8_dir, tmp_path / "q.ninfer"))
    assert art.weight_profile == "fp8"
    specs = art.quantized["text"]
    assert all(s.fmt == "fp8_e4m3_b128" for s in specs.values())
    assert ("model.layers.0.mlp.experts.gate_up_proj" in specs) == (kind == "moe")
    assert "model.embed_tokens.weight" not in specs and "lm_head.weight" not in specs
    hf = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, experts_implementation="eager"
    ).eval()
    ref_state = {}
    for name, w in dequantized.items():  # per-expert keys back to the fused banks transformers holds
        ref_state[name] = w
    if kind == "moe":
        for layer in range(hf.config.num_hidden_layers):
            p = f"model.layers.{layer}.mlp.experts."
            e = hf.config.num_experts
            gu = [
                torch.cat(
                    [ref_state.pop(f"{p}{i}.gate_proj.weight"), ref_state.pop(f"{p}{i}.up_proj.weight")]
                )
                for i in range(e)
            ]
            ref_state[p + "gate_up_proj"] = torch.stack(gu)
            ref_state[p + "down_proj"] = torch.stack(
                [ref_state.pop(f"{p}{i}.down_proj.weight") for i in range(e)]
            )
    _, unexpected = hf.load_state_dict(ref_state, strict=False)
    assert not unexpected
    prompt = torch.randint(
        0, hf.config.vocab_size, (60,), generator=torch.Generator().manual_seed(3)
    ).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    logits = LLM(art.path).logits(prompt)
    assert (logits - ref).abs().max() / ref.abs().max() <= 1e-4
