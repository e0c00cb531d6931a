"""The sizing ledger counts the MTP drafter's one-layer KV pool and the speculative snapshot slots."""

from __future__ import annotations

import torch

from ninfer.engine.pages import PAGE
from ninfer.engine.sizing import AUTO_HEADROOM, page_bytes, resolve_kv, slot_bytes, workspace_bytes
from tests.engine.tiny import tiny_config
from tests.spec.helpers import engine, mtp_model


def _pool_bytes(pool) -> int:
    return sum(t.numel() * t.element_size() for t in (*pool.k, *pool.v, *pool.k_scale, *pool.v_scale))


def test_ledger_matches_the_allocated_mtp_pool_and_slots() -> None:
    for kv_dtype in (None, "int8"):
        eng = engine(mtp_model(0), spec_method="mtp", draft_tokens=2, max_concurrency=2, kv_dtype=kv_dtype,
                     kv_capacity=512)  # fmt: skip
        try:
            led = eng.ledger
            assert led.mtp_kv_bytes == _pool_bytes(eng.spec.drafter.kv) > 0
            assert led.kv_bytes == _pool_bytes(eng.kv)
            assert led.spec_snapshot_slots == 2 and led.state_slots == eng.states.num_slots == 2 * 4
        finally:
            eng.shutdown(5)
    eng = engine(mtp_model(0), max_concurrency=2, kv_capacity=512)
    try:
        assert eng.ledger.mtp_kv_bytes == 0 and eng.ledger.spec_snapshot_slots == 0
    finally:
        eng.shutdown(5)


def test_auto_capacity_plans_for_the_mtp_pool(monkeypatch) -> None:
    cfg = tiny_config(512)
    pb, sb = page_bytes(cfg, torch.float32), slot_bytes(cfg, torch.float32)
    mtp_pb = PAGE * 2 * 1 * cfg.num_key_value_heads * cfg.head_dim * 4  # K and V of one layer, fp32
    free = AUTO_HEADROOM + workspace_bytes(cfg, 64, 8) + 32 * sb + 100 * pb + 7
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, free))
    args = (cfg, "auto", 1024, 8, 64, 32, torch.float32, torch.device("cuda", 0), 0)
    plain = resolve_kv(*args)
    spec = resolve_kv(*args, mtp_layers=1, snapshot_slots=8)
    budget = free - 32 * sb - plain.workspace_bytes - plain.headroom_bytes
    assert plain.num_pages == budget // pb == 100
    assert spec.num_pages == budget // (pb + mtp_pb) < 100
    assert spec.mtp_kv_bytes == spec.num_pages * mtp_pb and spec.mtp_page_bytes == mtp_pb
