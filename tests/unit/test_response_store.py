"""The local Responses store: LRU by records and by bytes, capacity, deletion, shared contexts."""

from __future__ import annotations

import json
import threading

import pytest

from ninfer.api.errors import ApiError
from ninfer.api.responses.logprobs import without_logprobs
from ninfer.api.responses.store import MIB, ResponseStore, StoredResponse, json_bytes, make_record


def item(i: int, text: str = "x") -> dict[str, object]:
    return {"id": f"msg_{i}", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": text}]}  # fmt: skip


def record(rid: str, text: str = "x", parent: StoredResponse | None = None) -> StoredResponse:
    return make_record(rid, {"id": rid, "object": "response"}, [item(0, text)], [item(1)], False, parent)


def test_record_bytes_are_envelope_items_and_context() -> None:
    r = record("a", "héllo")
    envelope = len(json.dumps({"id": "a", "object": "response"}, separators=(",", ":")).encode())
    inputs = len(json.dumps([item(0, "héllo")], ensure_ascii=False, separators=(",", ":")).encode())
    context = json_bytes(item(0, "héllo")) + json_bytes(item(1))
    assert r.nbytes == envelope + inputs + context
    assert r.context_bytes == sum(json_bytes(i) for i in r.context)


def test_child_context_extends_and_shares_parent_items() -> None:
    parent = record("a")
    child = record("b", parent=parent)
    assert [i["id"] for i in child.context] == ["msg_0", "msg_1", "msg_0", "msg_1"]
    assert child.context[0] is parent.context[0]
    assert child.context_bytes == sum(json_bytes(i) for i in child.context)


def test_lru_by_records_and_recency() -> None:
    store = ResponseStore(max_records=3, max_mib=1)
    for rid in "abc":
        assert store.put(record(rid)) == []
    assert store.get("a") is not None  # a becomes most recent
    assert store.put(record("d")) == ["b"]
    assert store.ids() == ["c", "a", "d"]
    assert store.get("b") is None and len(store) == 3


def test_lru_by_bytes() -> None:
    one = record("a", "x" * 1000).nbytes
    store = ResponseStore(max_records=100, max_mib=(2 * one + one // 2) / MIB)
    store.put(record("a", "x" * 1000))
    store.put(record("b", "x" * 1000))
    assert store.nbytes == 2 * one
    assert store.put(record("c", "x" * 1000)) == ["a"]
    assert store.ids() == ["b", "c"] and store.nbytes == 2 * one
    assert store.nbytes <= store.max_bytes


def test_single_response_larger_than_capacity_fails() -> None:
    store = ResponseStore(max_records=10, max_mib=1)
    store.put(record("keep"))
    big = record("big", "x" * MIB)
    with pytest.raises(ApiError) as info:
        store.put(big)
    assert (info.value.status, info.value.code) == (400, "response_store_capacity_exceeded")
    assert store.ids() == ["keep"]  # nothing was evicted for a record that can never fit
    with pytest.raises(ApiError):
        store.check_fits(big.nbytes)
    store.check_fits(store.max_bytes)


def test_exactly_full_capacity_is_accepted() -> None:
    r = record("a")
    store = ResponseStore(max_records=1, max_mib=r.nbytes / MIB)
    assert store.put(r) == [] and store.nbytes == store.max_bytes


def test_delete_keeps_descendants_usable() -> None:
    store = ResponseStore(max_records=10, max_mib=1)
    parent = record("a")
    store.put(parent)
    child = record("b", parent=store.get("a"))
    store.put(child)
    assert store.delete("a") is True and store.delete("a") is False
    assert store.get("a") is None
    kept = store.get("b")
    assert kept is not None and [i["id"] for i in kept.context][:2] == ["msg_0", "msg_1"]
    assert store.nbytes == child.nbytes


def test_replacing_an_id_recounts_bytes() -> None:
    store = ResponseStore(max_records=10, max_mib=1)
    store.put(record("a", "x" * 100))
    store.put(record("a", "y"))
    assert len(store) == 1 and store.nbytes == record("a", "y").nbytes


def test_invalid_limits() -> None:
    with pytest.raises(ValueError):
        ResponseStore(0, 1)
    with pytest.raises(ValueError):
        ResponseStore(1, 0)


def test_concurrent_puts_keep_the_bounds() -> None:
    store = ResponseStore(max_records=50, max_mib=1)

    def worker(t: int) -> None:
        for i in range(200):
            store.put(record(f"{t}-{i}"))
            store.get(f"{t}-{i // 2}")
            if i % 7 == 0:
                store.delete(f"{t}-{i - 3}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ids = store.ids()
    assert len(ids) <= 50 and len(set(ids)) == len(ids)
    assert store.nbytes == sum(r.nbytes for r in (store.get(i) for i in ids) if r is not None)


def test_context_keeps_output_text_without_its_logprobs() -> None:
    lp = {"token": "hi", "logprob": -0.5, "bytes": [104, 105], "top_logprobs": []}
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": [lp]}]}  # fmt: skip
    call = {"id": "fc_2", "type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    response = {"id": "a", "object": "response", "output": [msg, call]}
    r = make_record("a", response, [item(0)], without_logprobs([msg, call]), False, None)
    assert r.context[1]["content"][0] == {
        "type": "output_text",
        "text": "hi",
        "annotations": [],
        "logprobs": [],
    }
    assert r.context[2] is call and r.response["output"][0]["content"][0]["logprobs"] == [lp]
