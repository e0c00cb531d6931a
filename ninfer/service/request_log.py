"""The structured JSONL request log (schema v15): append-only, one flushed event per line."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel

SCHEMA = "ninfer_serve_request_log"
SCHEMA_VERSION = 15
REDACTED = "<redacted>"
_KEY_FLAGS = ("--api-key", "server.api_key", "+server.api_key", "++server.api_key")


class RequestLogError(Exception):
    """The configured log path cannot be used (startup aborts)."""


def new_server_instance_id() -> str:
    return uuid.uuid4().hex


def redact_argv(argv: Sequence[str], secret: str | None) -> list[str]:
    """Replace every API-key value in argv (flag, Hydra override, or the bare value) with <redacted>."""
    out: list[str] = []
    redact_next = False
    for arg in argv:
        if redact_next:
            out.append(REDACTED)
            redact_next = False
            continue
        flag, eq, _value = arg.partition("=")
        if flag in _KEY_FLAGS and eq:
            out.append(f"{flag}={REDACTED}")
        elif arg == "--api-key":
            out.append(arg)
            redact_next = True
        elif secret and secret in arg:
            out.append(arg.replace(secret, REDACTED))
        else:
            out.append(arg)
    return out


def _same_target(path: Path, artifact: str | None) -> bool:
    if not artifact:
        return False
    target = Path(artifact).resolve()
    resolved = path.resolve()
    return resolved == target or target in resolved.parents


class RequestLog:
    """Thread-safe JSONL writer; `None` path makes every call a no-op."""

    def __init__(self, path: str | None, server_instance_id: str, artifact: str | None = None) -> None:
        self.server_instance_id = server_instance_id
        self.path = path
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        if path is None:
            return
        target = Path(path)
        if _same_target(target, artifact):
            raise RequestLogError(f"request log path {path!r} resolves to the model artifact {artifact!r}")
        if not target.parent.is_dir():
            raise RequestLogError(f"request log directory {str(target.parent)!r} does not exist")
        try:
            self._file = open(target, "a", encoding="utf-8")
        except OSError as exc:
            raise RequestLogError(f"cannot open request log {path!r}: {exc.strerror or exc}") from None

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def emit(self, event: str, **fields: Any) -> None:
        """Write one event line and flush it (floats keep full precision)."""
        if self._file is None:
            return
        record = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "event": event,
            "timestamp_unix_ms": time.time_ns() // 1_000_000,
            "server_instance_id": self.server_instance_id,
            **fields,
        }
        line = json.dumps(record, ensure_ascii=False, allow_nan=False, default=_jsonable)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _jsonable(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)
