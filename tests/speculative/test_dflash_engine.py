"""`--spec dflash` through the engine on a tiny random MoE target with a tiny random DFlash drafter:
greedy outputs equal spec off (alone, batched, prefix reuse hit and miss), counters hold."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from ninfer.artifact.shapes import text_shapes
from ninfer.engine.pages import PAGE
from ninfer.model.cache import KVPool, StatePool, make_batch
from ninfer.model.config import MOE
from ninfer.model.dflash import DFlashConfig, DFlashDrafter, load_dflash
from ninfer.model.weights import load_model
from tests.engine.tiny import _tensor, tiny_config
from tests.speculative.helpers import PROMPTS, VOCAB, check_counters, engine, prompt, request, run_batch

DRAFTER = {
    "architectures": ["DFlashDraftModel"],
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 48,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "num_target_layers": 4,
    "dflash_config": {"block_size": 16, "target_layer_ids": [0, 2], "mask_token_id": 500},
}


def moe_config() -> Any:
    return dataclasses.replace(
        tiny_config(VOCAB),
        family=MOE,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=24,
    )


def drafter_tensors(seed: int = 1, config: dict | None = None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = DFlashDrafter(DFlashConfig.from_hf(config or DRAFTER)).state_dict()
    return {
        n: (1.0 if t.dim() == 1 else 0.0) + 0.2 * torch.randn(t.shape, generator=g) for n, t in shapes.items()
    }


def moe_model(seed: int = 0) -> Any:
    cfg = moe_config()
    g = torch.Generator().manual_seed(seed)
    return load_model(
        cfg, {n: _tensor(n, tuple(s), g) for n, s in text_shapes(cfg).items()}, torch.float32, "cpu"
    )


def dflash_drafter() -> DFlashDrafter:
    return load_dflash(DFlashConfig.from_hf(DRAFTER), drafter_tensors(), torch.float32, "cpu")


@pytest.fixture(scope="module")
def models() -> tuple[Any, Any, DFlashDrafter]:
    """Two copies of the target (speculation off; on, with the drafter's hooks) and the drafter."""
    return moe_model(), moe_model(), dflash_drafter()


@pytest.mark.parametrize(("k", "limit"), [(1, None), (4, None), (15, None), (1, 3), (4, 3)])
def test_greedy_batched_equals_spec_off(models, k: int, limit: int | None) -> None:
    """vocab_limit 3 makes random drafts agree often, so whole runs are accepted too."""
    plain, spec_model, drafter = models
    reqs = [request(p, max_tokens=20 + 3 * i) for i, p in enumerate(PROMPTS[:5])]
    ref = engine(plain, no_prefix_reuse=True, vocab_limit=limit)
    spec = engine(spec_model, dflash=drafter, spec_method="dflash", draft_tokens=k, vocab_limit=limit)
    try:
        want = run_batch(ref, reqs)
        got = run_batch(spec, reqs)
        alone = run_batch(spec, reqs[:1])
        assert [t for t, _, _ in got] == [t for t, _, _ in want]
        assert alone[0][0] == want[0][0]
        counters = [check_counters(st, k, "dflash") for _, st, _ in got]
        assert sum(c["rounds"] for c in counters) > 0
        if limit is not None:
            assert sum(c["accepted_tokens"] for c in counters) > 0
    finally:
        ref.shutdown(5)
        spec.shutdown(5)


@pytest.mark.parametrize("k", [3, 15])
def test_prefix_reuse_hit_and_miss_equal_spec_off(models, k: int) -> None:
    plain, spec_model, drafter = models
    ref = engine(plain, no_prefix_reuse=True, max_concurrency=2, kv_capacity=512, vocab_limit=5)
    spec = engine(
        spec_model,
        dflash=drafter,
        spec_method="dflash",
        draft_tokens=k,
        max_concurrency=2,
        kv_capacity=512,
        vocab_limit=5,
    )
    try:
        p1 = prompt(100, 1)
        ((g1, st1, _),) = run_batch(spec, [request(p1, max_tokens=12, response=100, turn=70)])
        p2 = (*p1, *g1, *prompt(20, 2))
        p4 = (*p1[:70], *prompt(30, 4))
        turns = [(p1, g1, st1)]
        for p in (p2, p4):
            ((g, st, _),) = run_batch(spec, [request(p, max_tokens=12)])
            turns.append((p, g, st))
        paths = [st.reuse_path for _, _, st in turns]
        assert paths == ["none", "append_frontier", "restore_turn_checkpoint"]
        for p, got, st in turns:
            ((want, _, _),) = run_batch(ref, [request(p, max_tokens=12)])
            assert got == want
            check_counters(st, k, "dflash")
    finally:
        ref.shutdown(5)
        spec.shutdown(5)


def reference_drafts(target: Any, drafter: Any, seq: list[int], k: int, limit: int | None) -> list[int]:
    """Drafts recomputed from scratch: the target run once over `seq[:-1]` (its layer outputs as the
    context), then [seq[-1], MASK x k] through the drafter with the whole context."""
    ctx_ids, n = seq[:-1], len(seq) - 1
    cfg = target.config
    pages = list(range(-(-n // PAGE)))
    kv = KVPool.for_config(cfg, len(pages), torch.float32, "cpu")
    states = StatePool.for_config(cfg, 1, torch.float32, "cpu")
    target.capture_layers = (0, 2)
    try:
        target(make_batch([ctx_ids], [0], [0], [pages]), kv, states)
        feats = torch.cat([target.captured[i][0] for i in (0, 2)], -1)  # [n, 2H]
    finally:
        target.capture_layers = ()
    pos = torch.arange(n + k + 1)[None]
    ctx = drafter.context_kv(feats[None], pos[:, :n])
    block = torch.tensor([[seq[-1]] + [DRAFTER["dflash_config"]["mask_token_id"]] * k])
    hidden = drafter(
        target.embed_tokens(block), pos[:, n:], ctx, pos[:, :n], torch.ones(1, n, dtype=torch.bool)
    )
    logits = drafter.logits(hidden[0, 1:], target.lm_head)  # [k, V]
    if limit is not None:
        logits[:, limit:] = float("-inf")
    return logits.argmax(-1).tolist()


@pytest.mark.parametrize("limit", [None, 4])
def test_engine_drafts_equal_a_from_scratch_drafter(models, limit: int | None) -> None:
    """The context K/V kept across prefill chunks, accepted runs and prefix reuse equal a full rebuild."""
    plain, spec_model, drafter = models
    k = 5
    spec = engine(
        spec_model, dflash=drafter, spec_method="dflash", draft_tokens=k, prefill_chunk=32, vocab_limit=limit
    )
    seen: list[tuple[int, int, list[int]]] = []
    inner = spec.spec.drafter.propose

    def propose(rows, kk):
        out = inner(rows, kk)
        seen.extend((r.cached, r.token, p.tokens) for r, p in zip(rows, out, strict=True))
        return out

    spec.spec.drafter.propose = propose
    try:
        p1 = prompt(90, 5)
        ((g1, _, _),) = run_batch(spec, [request(p1, max_tokens=16, response=90)])
        rounds1 = len(seen)
        p2 = (*p1, *g1, *prompt(10, 6))  # a prefix-reuse hit
        ((g2, st2, _),) = run_batch(spec, [request(p2, max_tokens=16)])
        assert st2.reuse_path == "append_frontier"
    finally:
        spec.shutdown(5)
    with torch.no_grad():
        for i, (position, token, drafts) in enumerate(seen):
            full = [*p1, *g1] if i < rounds1 else [*p2, *g2]
            assert full[position] == token
            assert drafts == reference_drafts(plain, drafter, full[: position + 1], k, limit), i
