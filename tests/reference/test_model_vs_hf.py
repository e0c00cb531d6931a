"""ninfer's Qwen3.5 dense and MoE models vs transformers 5.x (fp32 and bf16) over pages and state slots."""

from __future__ import annotations

import pytest
import torch
from ref_models import VOCAB, Sequences, hf_model, hf_to_bf16, our_model

from ninfer.model.cache import make_batch

FP32_TOL = 1e-4
BF16_TOL = 2e-2


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


@pytest.fixture(scope="module", params=["dense", "moe"])
def pair(request: pytest.FixtureRequest):
    hf = hf_model(request.param, seed=11)
    ids = torch.randint(0, VOCAB, (170,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]  # [170, vocab], one full forward
    return request.param, hf, our_model(hf), ids, ref


def test_prefill_130(pair) -> None:
    kind, _, model, ids, ref = pair
    seqs = Sequences(model)
    seqs.open(3)
    out = model.logits(seqs.step(model, {3: ids[:130].tolist()}))[0]
    err = rel_err(out, ref[:130])
    print(f"[{kind}] prefill 130 fp32 rel err {err:.2e}")
    assert err <= FP32_TOL


def test_prefill_then_40_decode_steps(pair) -> None:
    kind, _, model, ids, ref = pair
    seqs = Sequences(model)
    seqs.open(0)
    seqs.step(model, {0: ids[:130].tolist()})
    worst = 0.0
    for t in range(130, 170):
        out = model.logits(seqs.step(model, {0: [int(ids[t])]}))[0, 0]
        worst = max(worst, rel_err(out, ref[t]))
    print(f"[{kind}] 40 decode steps fp32 max rel err {worst:.2e}")
    assert worst <= FP32_TOL


def test_chunked_prefill_17(pair) -> None:
    kind, _, model, ids, ref = pair
    seqs = Sequences(model)
    seqs.open(1)
    outs = [
        model.logits(seqs.step(model, {1: ids[i : min(i + 17, 130)].tolist()}))[0] for i in range(0, 130, 17)
    ]
    err = rel_err(torch.cat(outs), ref[:130])
    print(f"[{kind}] chunks of 17 fp32 rel err {err:.2e}")
    assert err <= FP32_TOL


def test_batch_of_4_different_lengths(pair) -> None:
    """Four sequences with their own slots and shuffled pages: prefill each, then decode and verify together."""
    kind, hf, model, _, _ = pair
    gen = torch.Generator().manual_seed(9)
    lens = {5: 37, 2: 70, 7: 129, 0: 3}
    seqs_ids = {s: torch.randint(0, VOCAB, (n + 8,), generator=gen) for s, n in lens.items()}
    refs = {}
    with torch.no_grad():
        for s, x in seqs_ids.items():
            refs[s] = hf(x[None]).logits[0]
    seqs = Sequences(model, num_pages=40)
    for s, n in lens.items():
        seqs.open(s)
        seqs.step(model, {s: seqs_ids[s][:n].tolist()})
    worst = 0.0
    for t in range(4):  # batched decode, q = 1
        out = model.logits(seqs.step(model, {s: [int(seqs_ids[s][n + t])] for s, n in lens.items()}))
        for row, (s, n) in enumerate(lens.items()):
            worst = max(worst, rel_err(out[row, 0], refs[s][n + t]))
    # batched multi-token call (speculative-verify shape), q = 4
    out = model.logits(seqs.step(model, {s: seqs_ids[s][n + 4 : n + 8].tolist() for s, n in lens.items()}))
    for row, (s, n) in enumerate(lens.items()):
        worst = max(worst, rel_err(out[row], refs[s][n + 4 : n + 8]))
    print(f"[{kind}] batch of 4 fp32 max rel err {worst:.2e}")
    assert worst <= FP32_TOL


def test_bf16_matches_transformers_bf16(pair) -> None:
    kind, hf32, _, ids, _ = pair
    hf = hf_to_bf16(hf32)
    model = our_model(hf, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = hf(ids[None, :140]).logits[0].float()
    seqs = Sequences(model)
    seqs.open(0)
    out = [model.logits(seqs.step(model, {0: ids[:130].tolist()}))[0]]
    for t in range(130, 140):
        out.append(model.logits(seqs.step(model, {0: [int(ids[t])]}))[0])
    err = rel_err(torch.cat(out), ref)
    print(f"[{kind}] bf16 prefill 130 + 10 decode rel err {err:.2e}")
    assert err <= BF16_TOL


def test_make_batch_rejects_short_page_table() -> None:
    with pytest.raises(ValueError, match="needs 2 pages"):
        make_batch([[1] * 10], [60], [0], [[3]])
