"""The process-local Responses store: an LRU bounded by record count and by stored bytes."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ninfer.api.errors import ApiError

MIB = 1024 * 1024


def json_bytes(value: Any) -> int:
    """Size of `value` as compact UTF-8 JSON: the unit the store budget is counted in."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


@dataclass(frozen=True)
class StoredResponse:
    """One retained terminal Response and what a continuation needs from it.

    `context` is the complete Item history a child continues from: the parent's context, this
    request's normalized input Items, then its output Items (top-level instructions excluded).
    It shares Item objects with the parent's context, so a child stays usable after the parent
    is deleted or evicted.
    """

    id: str
    response: dict[str, Any]  # the terminal wire object returned by GET
    input_items: tuple[dict[str, Any], ...]
    context: tuple[dict[str, Any], ...]
    preserve_thinking: bool
    context_bytes: int  # JSON bytes of `context`
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        size = json_bytes(self.response) + json_bytes(list(self.input_items)) + self.context_bytes
        object.__setattr__(self, "nbytes", size)


def make_record(
    response_id: str,
    response: dict[str, Any],
    input_items: Sequence[dict[str, Any]],
    output_items: Sequence[dict[str, Any]],
    preserve_thinking: bool,
    parent: StoredResponse | None,
) -> StoredResponse:
    """A record whose context is `parent.context + input_items + output_items`."""
    history = parent.context if parent is not None else ()
    history_bytes = parent.context_bytes if parent is not None else 0
    new = (*input_items, *output_items)
    return StoredResponse(
        id=response_id,
        response=response,
        input_items=tuple(input_items),
        context=(*history, *new),
        preserve_thinking=preserve_thinking,
        context_bytes=history_bytes + sum(json_bytes(item) for item in new),
    )


def capacity_exceeded(nbytes: int, limit: int) -> ApiError:
    return ApiError(
        400,
        "response_store_capacity_exceeded",
        f"the Response needs {nbytes} bytes of local storage but the response store holds at most "
        f"{limit} bytes (response_store_max_mib); send store=false or raise the limit",
        "store",
    )


class ResponseStore:
    """Thread-safe LRU of `StoredResponse` by id; lookups refresh recency."""

    def __init__(self, max_records: int, max_mib: float) -> None:
        if max_records < 1 or max_mib <= 0:
            raise ValueError("the response store needs max_records >= 1 and max_mib > 0")
        self.max_records = max_records
        self.max_bytes = int(max_mib * MIB)
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def check_fits(self, nbytes: int) -> None:
        """Raise `response_store_capacity_exceeded` when `nbytes` can never be retained."""
        if nbytes > self.max_bytes:
            raise capacity_exceeded(nbytes, self.max_bytes)

    def put(self, record: StoredResponse) -> list[str]:
        """Retain `record` as most recent; returns the ids evicted to make room."""
        self.check_fits(record.nbytes)
        evicted: list[str] = []
        with self._lock:
            old = self._records.pop(record.id, None)
            if old is not None:
                self._bytes -= old.nbytes
            while self._records and (
                len(self._records) + 1 > self.max_records or self._bytes + record.nbytes > self.max_bytes
            ):
                rid, gone = self._records.popitem(last=False)
                self._bytes -= gone.nbytes
                evicted.append(rid)
            self._records[record.id] = record
            self._bytes += record.nbytes
        return evicted

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            record = self._records.get(response_id)
            if record is not None:
                self._records.move_to_end(response_id)
            return record

    def delete(self, response_id: str) -> bool:
        with self._lock:
            record = self._records.pop(response_id, None)
            if record is None:
                return False
            self._bytes -= record.nbytes
            return True

    def ids(self) -> list[str]:
        """Ids from least to most recently used."""
        with self._lock:
            return list(self._records)
