"""Model-level checks of the slot-pool step path (per-token GDN states for verification) and int8 KV."""

from __future__ import annotations

import pytest
import torch
from ref_models import VOCAB, hf_model, our_model

from ninfer.model.cache import PAGE_SIZE, KVPool, StatePool, make_batch
from ninfer.model.gdn import STEP_MAX_TOKENS
from ninfer.model.qwen35 import Qwen35Model


@pytest.fixture(scope="module", params=["dense", "moe"])
def model(request: pytest.FixtureRequest) -> Qwen35Model:
    return our_model(hf_model(request.param, seed=3))


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run(model, kv, states, tokens, start, slot, pages, write_slots=None) -> torch.Tensor:
    batch = make_batch([tokens], [start], [slot], [pages], write_slots=write_slots)
    with torch.no_grad():
        return model.logits(model(batch, kv, states))[0]  # [q, vocab]


def test_verify_writes_per_token_states_and_continues_from_accepted(model: Qwen35Model) -> None:
    cfg = model.config
    prompt, drafts, nxt = _ids(40, 1), _ids(4, 2), _ids(1, 3)
    pages = [2, 0]
    kv = KVPool.for_config(cfg, 4, torch.float32, "cpu")
    states = StatePool.for_config(cfg, 6, torch.float32, "cpu")
    _run(model, kv, states, prompt, 0, 0, pages)
    # verify: read slot 0, the state after draft j goes to slot 1 + j
    verify = _run(model, kv, states, drafts, 40, 0, pages, write_slots=[[1, 2, 3, 4]])
    accepted = 2  # continue from the state after drafts[:2]; their KV rows stay valid
    cont = _run(model, kv, states, nxt, 40 + accepted, 1 + accepted - 1, pages)

    kv2 = KVPool.for_config(cfg, 4, torch.float32, "cpu")
    states2 = StatePool.for_config(cfg, 1, torch.float32, "cpu")
    full = _run(model, kv2, states2, prompt + drafts, 0, 0, pages)  # q > STEP_MAX_TOKENS: chunked
    assert len(prompt) > STEP_MAX_TOKENS
    assert torch.allclose(verify, full[40:], atol=1e-4, rtol=1e-4)
    kv3 = KVPool.for_config(cfg, 4, torch.float32, "cpu")
    states3 = StatePool.for_config(cfg, 1, torch.float32, "cpu")
    seq = prompt + drafts[:accepted] + nxt
    ref = _run(model, kv3, states3, seq, 0, 0, pages)[-1]
    assert torch.allclose(cont[0], ref, atol=1e-4, rtol=1e-4)
    # the slots after drafts 3 and 4 hold different states from slot 2
    assert not torch.allclose(states.ssm[0][2], states.ssm[0][4])


def test_int8_kv_logits_and_greedy_agreement(model: Qwen35Model) -> None:
    """int8 KV vs fp32 KV, teacher-forced over a 150-token prompt and 40 decode steps:
    max relative logit error <= 1e-2 and >= 95 % greedy (argmax) agreement."""
    cfg = model.config
    ids = _ids(190, 4)
    pages = [4, 1, 3, 0]
    runs = {}
    for kv_dtype in (None, "int8"):
        kv = KVPool.for_config(cfg, 5, torch.float32, "cpu", kv_dtype=kv_dtype)
        states = StatePool.for_config(cfg, 1, torch.float32, "cpu")
        rows = [_run(model, kv, states, ids[:150], 0, 0, pages)[-1:]]
        rows += [_run(model, kv, states, [ids[t]], t, 0, pages) for t in range(150, 189)]
        runs[kv_dtype] = torch.cat(rows)  # [40, vocab]
        assert kv.quantized == (kv_dtype == "int8")
    ref, out = runs[None], runs["int8"]
    err = ((out - ref).abs().max() / ref.abs().max()).item()
    agree = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
    kind = "moe" if cfg.is_moe else "dense"
    print(f"[{kind}] int8 KV: max rel logit err {err:.2e}, greedy agreement {agree:.3f}")
    assert err <= 1e-2
    assert agree >= 0.95


def test_kv_pool_dtypes() -> None:
    cfg = our_model(hf_model("dense", seed=0)).config
    pool = KVPool.for_config(cfg, 2, torch.float32, "cpu", kv_dtype="int8")
    assert pool.k[0].dtype == torch.int8 and pool.k_scale[0].shape == (2, PAGE_SIZE, cfg.num_key_value_heads)
    assert KVPool.for_config(cfg, 2, torch.float32, "cpu", kv_dtype="bf16").k[0].dtype == torch.bfloat16
    assert KVPool.for_config(cfg, 2, torch.float32, "cpu").layer(0).k_scale is None
    n, nkv, hd = len(cfg.attention_layers), cfg.num_key_value_heads, cfg.head_dim
    assert KVPool.bytes_per_token(cfg, torch.int8) == 2 * n * nkv * (hd + 4)  # int8 values + fp32 scale
    assert KVPool.bytes_per_token(cfg, torch.bfloat16) == 2 * n * nkv * hd * 2
    with pytest.raises(ValueError, match="unknown kv_dtype"):
        KVPool.for_config(cfg, 2, torch.float32, "cpu", kv_dtype="int4")
