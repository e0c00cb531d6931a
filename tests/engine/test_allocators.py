"""Page allocator, slot layout, lifetime tickets and the KV sizing rejections."""

from __future__ import annotations

import pytest
import torch

from ninfer.engine.pages import PAGE, PageAllocator, pages_for
from ninfer.engine.sizing import page_bytes, resolve_kv, slot_bytes
from ninfer.engine.slots import SlotLayout
from ninfer.engine.tickets import TicketBook
from ninfer.engine.types import EngineConfigError, EngineOverloaded
from tests.engine.tiny import make_engine, tiny_config


def test_pages_for_and_allocator() -> None:
    assert (pages_for(0), pages_for(1), pages_for(64), pages_for(65)) == (0, 1, 1, 2)
    a = PageAllocator(4)
    got = a.alloc(3)
    assert sorted(got) == [0, 1, 2] and a.free_count == 1
    with pytest.raises(MemoryError):
        a.alloc(2)
    a.free(got[:2])
    assert a.free_count == 3
    with pytest.raises(RuntimeError):
        a.free(got[:1])  # double free


def test_slot_layout_is_disjoint_and_leaves_room_for_drafts() -> None:
    lay = SlotLayout(lanes=3, draft_slots=4)
    seen = []
    for lane in range(3):
        seen += [lay.live(lane), lay.checkpoint(lane, "turn"), lay.checkpoint(lane, "response")]
        seen += list(lay.drafts(lane))
    assert sorted(seen) == list(range(lay.num_slots)) and lay.num_slots == 3 * 7


def test_tickets_bound_lifetime_capacity() -> None:
    book = TicketBook(capacity=2, timeout_s=1.0)
    a, b = book.reserve(), book.reserve()
    with pytest.raises(EngineOverloaded):
        book.reserve()
    a.release()
    a.release()  # idempotent
    c = book.reserve()
    assert book.live == 2
    b.release()
    c.release()
    assert book.live == 0


def test_ledger_bytes() -> None:
    cfg = tiny_config()
    # one attention layer, K and V, 64 tokens, 1 kv head of 16, fp32
    assert page_bytes(cfg, torch.float32) == 1 * 2 * PAGE * 1 * 16 * 4
    conv = cfg.conv_dim * 3 * 4
    ssm = 2 * 8 * 8 * 4
    assert slot_bytes(cfg, torch.float32) == 3 * (conv + ssm)
    led = resolve_kv(cfg, None, 300, 2, 64, 6, torch.float32, torch.device("cpu"), 0)
    assert (led.policy, led.num_pages, led.kv_capacity) == ("max_context", 5, 320)
    led = resolve_kv(cfg, "auto", 300, 2, 64, 6, torch.float32, torch.device("cpu"), 0)
    assert led.policy == "auto" and led.num_pages == 5


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"max_context": 256, "kv_capacity": 200}, "smaller than one sequence"),
        ({"max_context": 64, "max_concurrency": 8, "kv_capacity": 64}, "fewer than one page per lane"),
        ({"max_context": 128, "max_concurrency": 2, "kv_capacity": 260}, "larger than all lanes could use"),
        ({"max_concurrency": 9}, "max_concurrency must be in 1..8"),
        ({"kv_capacity": "lots"}, "kv_capacity must be"),
    ],
)
def test_startup_rejections(small_model, kw, needle) -> None:
    with pytest.raises(EngineConfigError, match=needle) as err:
        make_engine(small_model, **kw)
    assert "\n" not in str(err.value)


def test_largest_legal_capacity_accepted(small_model) -> None:
    eng = make_engine(small_model, max_context=128, max_concurrency=2, kv_capacity=256)
    assert eng.allocator.num_pages == 4
    eng.shutdown(1)
