"""The sizing ledger counts the MTP drafter's one-layer KV pool and the speculative snapshot slots;
the cold tier's arenas come from the settings (secondary GPUs, the host arena's size or none)."""

from __future__ import annotations

import torch

from ninfer.engine.pages import PAGE
from ninfer.engine.sizing import AUTO_HEADROOM, page_bytes, resolve_kv, slot_bytes, workspace_bytes
from tests.engine.tiny import tiny_config
from tests.speculative.helpers import engine, mtp_model


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
            # k = 2 scratch slots per lane (one per draft position) next to each lane's 3 others
            assert led.spec_snapshot_slots == 2 * 2 and led.state_slots == eng.states.num_slots == 2 * 5
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


def test_settings_reach_the_engine_config() -> None:
    from types import SimpleNamespace

    from ninfer.bootstrap import engine_config
    from ninfer.config.loader import load_settings

    artifact = SimpleNamespace(model_id="demo", sampler_model_id="demo", family="qwen3_5")
    argv = [
        "cold_tier.device=2",
        "cold_tier.capacity_mib=300",
        "cold_tier.staging_mib=8",
        "cold_tier.host_mib=0",
    ]
    cfg = engine_config(load_settings(argv), artifact, "cpu", "float32")
    assert (
        cfg.cold_tier, cfg.cold_tier_device, cfg.cold_tier_capacity_mib, cfg.cold_tier_staging_mib, cfg.cold_tier_host_mib
    ) == (True, 2, 300, 8, 0)  # fmt: skip
    assert engine_config(load_settings([]), artifact, "cpu", "float32").cold_tier_host_mib is None
    assert not engine_config(load_settings(["cold_tier.enabled=false"]), artifact, "cpu", "float32").cold_tier


def test_cuda_arena_selection(monkeypatch) -> None:
    from ninfer.engine.cold_tier_devices import cuda_arenas
    from ninfer.engine.cold_tier_store import MIB

    free = {0: 50 << 30, 1: 10 << 30, 2: 100 * MIB}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (free[i], 80 << 30))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    arenas, why = cuda_arenas(torch.device("cuda", 0), -1, 0)
    assert arenas == [] and "1 CUDA device" in why
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    arenas, _ = cuda_arenas(torch.device("cuda", 0), -1, 0)  # cuda:2 has less than 512 MiB free
    assert [(str(a.device), a.capacity) for a in arenas] == [("cuda:1", (10 << 30) - 256 * MIB)]
    arenas, _ = cuda_arenas(torch.device("cuda", 1), -1, 1024)
    assert [(str(a.device), a.capacity) for a in arenas] == [("cuda:0", 1 << 30)]
    arenas, _ = cuda_arenas(torch.device("cuda", 0), 2, 64)  # pinned: taken whatever is free
    assert [(str(a.device), a.capacity) for a in arenas] == [("cuda:2", 64 * MIB)]
    for device in (0, 3):
        arenas, why = cuda_arenas(torch.device("cuda", 0), device, 0)
        assert arenas == [] and "not a secondary device" in why


def test_host_arena_from_the_settings(caplog, monkeypatch) -> None:
    """Unset: a quarter of the free host memory, said at startup; N MiB: N MiB; 0: no tier on the CPU."""
    import logging

    from ninfer.engine import cold_tier_host
    from ninfer.engine.cold_tier_host import HostArena
    from tests.engine.tiny import make_engine, tiny_model

    monkeypatch.setattr(cold_tier_host, "free_host_bytes", lambda: 10 << 30)
    model = tiny_model(512)
    for host_mib, capacity in ((None, 10 << 28), (3, 3 << 20), (0, None)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="ninfer.engine.cold_tier"):
            eng = make_engine(model, max_concurrency=1, cold_tier_host_mib=host_mib)
        eng.shutdown(5)
        lines = [r.getMessage() for r in caplog.records if r.name == "ninfer.engine.cold_tier"]
        if capacity is None:
            assert eng.cold_tier is None and eng.cache.tier is None
            assert lines == [
                "cold tier inactive: the engine runs on cpu, no secondary GPU; "
                "the host arena is off (cold_tier.host_mib=0)"
            ]
            continue
        assert eng.cold_tier is not None and eng.cache.tier is eng.cold_tier
        (arena,) = eng.cold_tier.store.arenas
        assert isinstance(arena, HostArena) and arena.capacity == capacity and not arena.pinned
        how = "25% of 10.0 GiB free host memory" if host_mib is None else f"cold_tier.host_mib={host_mib}"
        assert lines == [
            f"cold tier: host arena {capacity / (1 << 30):.2f} GiB, plain (no CUDA: not pinned), {how}",
            f"cold tier: 1 arena(s) [cpu], capacity {capacity / (1 << 30):.2f} GiB, staging 0 MiB",
        ]


def test_host_arena_beside_secondary_gpus_only_when_asked(monkeypatch) -> None:
    from ninfer.engine import cold_tier_host
    from ninfer.engine.cold_tier_host import host_capacity

    monkeypatch.setattr(cold_tier_host, "free_host_bytes", lambda: 8 << 30)
    assert host_capacity(None, beside_devices=True)[0] == 0  # the secondary GPUs hold the tier
    assert host_capacity(None, beside_devices=False)[0] == 2 << 30
    assert host_capacity(512, beside_devices=True) == (512 << 20, "cold_tier.host_mib=512")
    assert host_capacity(0, beside_devices=False)[0] == 0


def test_lane_image_covers_the_dflash_context_pool() -> None:
    """A parked lane carries the DFlash drafter's context K/V (same page ids as the trunk)."""
    from types import SimpleNamespace

    from ninfer.engine.cold_tier import lane_pools
    from ninfer.engine.speculative.dflash import DFlashEngineDrafter

    trunk, ctx, states = object(), object(), object()
    drafter = object.__new__(DFlashEngineDrafter)
    drafter.kv = ctx
    pools = lane_pools(trunk, states, SimpleNamespace(drafter=drafter))
    assert list(pools.kv) == [trunk, ctx] and pools.drafter is None
    assert list(lane_pools(trunk, states, None).kv) == [trunk]
