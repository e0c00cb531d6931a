"""MTP head vs its formula (transformers' decoder layer for the block), weight checks, greedy generate vs transformers."""

from __future__ import annotations

import pytest
import torch
from ref_models import VOCAB, Sequences, hf_model, our_config, our_model
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5TextRotaryEmbedding
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer

from ninfer import LLM, SamplingParams
from ninfer.model.cache import KVPool, make_batch
from ninfer.model.weights import WeightError, load_model


def _rms1p(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def _mtp_tensors(hf: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Random `mtp.*` tensors; the block is a copy-shaped full-attention layer of the trunk."""
    g = torch.Generator().manual_seed(seed)
    cfg = hf.config
    h = cfg.hidden_size
    attn_layer = cfg.layer_types.index("full_attention")
    out = {
        f"mtp.layers.0.{k}": torch.randn(v.shape, generator=g) * 0.3 / max(v.shape[-1], 1) ** 0.5
        for k, v in hf.model.layers[attn_layer].state_dict().items()
    }
    for k in list(out):
        if "norm" in k:
            out[k] = torch.randn(out[k].shape, generator=g) * 0.2
    out["mtp.fc.weight"] = torch.randn(h, 2 * h, generator=g) / (2 * h) ** 0.5
    for k in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{k}.weight"] = torch.randn(h, generator=g) * 0.2
    return out


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_mtp_head_matches_formula(kind: str) -> None:
    hf = hf_model(kind, seed=4)
    mtp = _mtp_tensors(hf, seed=6)
    model = load_model(our_config(hf), {**hf.state_dict(), **mtp})
    assert model.mtp_available
    t = 75
    ids = torch.randint(0, VOCAB, (t + 1,), generator=torch.Generator().manual_seed(2))
    eps = hf.config.rms_norm_eps

    # reference: trunk hidden from transformers, then the MTP formula in plain torch around
    # transformers' own decoder layer (loaded with the mtp.layers.0 tensors)
    with torch.no_grad():
        h_trunk = hf.model(ids[None, :t]).last_hidden_state  # [1, t, H] after the final norm
        emb = hf.model.embed_tokens.weight[ids[1 : t + 1]][None]
        e = _rms1p(emb, mtp["mtp.pre_fc_norm_embedding.weight"], eps)
        hh = _rms1p(h_trunk, mtp["mtp.pre_fc_norm_hidden.weight"], eps)
        x = torch.cat([e, hh], -1) @ mtp["mtp.fc.weight"].T
        cfg = hf.config
        layer_cls = Qwen3_5DecoderLayer if kind == "dense" else Qwen3_5MoeDecoderLayer
        layer = layer_cls(cfg, cfg.layer_types.index("full_attention")).eval()
        layer.load_state_dict(
            {k[len("mtp.layers.0.") :]: v for k, v in mtp.items() if k.startswith("mtp.layers.0.")}
        )
        pos = torch.arange(t)[None, None].expand(3, 1, t)
        cos_sin = Qwen3_5TextRotaryEmbedding(cfg)(x, pos)
        y = layer(x, position_embeddings=cos_sin, attention_mask=None)
        ref = _rms1p(y, mtp["mtp.norm.weight"], eps) @ hf.lm_head.weight.T  # [1, t, vocab]

    # ninfer: trunk prefill, then the MTP over the first 60 rows in one call and the rest one by one
    seqs = Sequences(model)
    seqs.open(0)
    hidden = seqs.step(model, {0: ids[:t].tolist()})
    mtp_kv = KVPool.for_config(model.config, 8, torch.float32, "cpu", num_layers=1)
    head_seqs = Sequences(model, num_pages=8, seed=3)
    head_seqs.kv = mtp_kv
    head_seqs.open(1)
    outs = []
    for lo, hi in [(0, 60)] + [(i, i + 1) for i in range(60, t)]:
        batch_rows = {1: ids[lo + 1 : hi + 1].tolist()}
        head_seqs._reserve(1, hi)
        batch = make_batch([batch_rows[1]], [lo], [1], [head_seqs.pages[1]])
        with torch.no_grad():
            outs.append(model.mtp.logits(model.mtp(batch, hidden[:, lo:hi], mtp_kv))[0])
    out = torch.cat(outs)
    err = ((out - ref[0]).abs().max() / ref.abs().max()).item()
    print(f"[{kind}] MTP logits rel err {err:.2e}")
    assert err <= 1e-4


def test_weights_checked_and_mtp_optional() -> None:
    hf = hf_model("dense", seed=1)
    cfg = our_config(hf)
    sd = dict(hf.state_dict())
    assert load_model(cfg, sd).mtp_available is False
    with pytest.raises(WeightError, match="missing 1"):
        load_model(cfg, {k: v for k, v in sd.items() if k != "model.norm.weight"})
    with pytest.raises(WeightError, match="unexpected 1"):
        load_model(cfg, {**sd, "model.extra.weight": torch.zeros(1)})
    with pytest.raises(WeightError, match="mis-shaped 1"):
        load_model(cfg, {**sd, "lm_head.weight": torch.zeros(3, 3)})


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_greedy_generate_matches_transformers(kind: str) -> None:
    hf = hf_model(kind, seed=8)
    llm = LLM.from_model(our_model(hf))
    prompts = [
        torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (23, 70)
    ]
    outs = llm.generate(prompts, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=False))
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, pad_token_id=0)
        assert list(out.token_ids) == ref[0, len(prompt) :].tolist()
        assert out.finish_reason == "length" and out.cached_tokens == 0


def test_generate_stops_on_eos_and_rejects_sampling() -> None:
    hf = hf_model("dense", seed=8)
    llm = LLM.from_model(our_model(hf))
    prompt = list(range(10))
    first = llm.generate(prompt, SamplingParams(max_tokens=3, temperature=0.0))[0].token_ids
    assert llm.generate_reference(prompt, SamplingParams(max_tokens=3, temperature=0.0))[0].token_ids == first
    out = llm.generate(prompt, SamplingParams(max_tokens=5, temperature=0.0, stop_token_ids=(first[1],)))[0]
    assert out.finish_reason == "stop" and out.token_ids == first[:2]
    with pytest.raises(ValueError, match="greedily"):
        llm.generate_reference(prompt, SamplingParams(max_tokens=3, temperature=0.7))
    # sampling runs through the engine: the same seed gives the same tokens
    sampled = [
        llm.generate(prompt, SamplingParams(max_tokens=6, temperature=0.7, seed=5, ignore_eos=True))[0]
        for _ in range(2)
    ]
    assert sampled[0].token_ids == sampled[1].token_ids and len(sampled[0].token_ids) == 6
    llm.close()
    logits = llm.logits(prompt)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    assert ((logits - ref).abs().max() / ref.abs().max()) <= 1e-4
