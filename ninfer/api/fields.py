"""Typed readers for request JSON that raise field-specific 400 errors."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ninfer.api.errors import ApiError, invalid, unknown_parameter

_MISSING = object()


def parse_body(raw: bytes) -> dict[str, Any]:
    """Decode a JSON object body; anything else is a 400 with code `invalid_json`."""
    import json

    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, "invalid_json", f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "invalid_json", "request body must be a JSON object")
    return value


def reject_unknown(body: Mapping[str, Any], known: Iterable[str], prefix: str = "") -> None:
    """Fail with `unknown_parameter` on the first field not in `known`."""
    allowed = set(known)
    for key in body:
        if key not in allowed:
            raise unknown_parameter(prefix + key)


def _present(body: Mapping[str, Any], key: str) -> Any:
    value = body.get(key, _MISSING)
    return _MISSING if value is None else value


def req_str(body: Mapping[str, Any], key: str, param: str | None = None, nonempty: bool = True) -> str:
    value = _present(body, key)
    if value is _MISSING:
        raise invalid(
            param or key, f"missing required parameter: {param or key!r}", "missing_required_parameter"
        )
    if not isinstance(value, str):
        raise invalid(param or key, f"{param or key!r} must be a string", "invalid_type")
    if nonempty and not value:
        raise invalid(param or key, f"{param or key!r} must not be empty", "invalid_value")
    return value


def opt_str(body: Mapping[str, Any], key: str, param: str | None = None) -> str | None:
    value = _present(body, key)
    if value is _MISSING:
        return None
    if not isinstance(value, str):
        raise invalid(param or key, f"{param or key!r} must be a string", "invalid_type")
    return value


def opt_bool(body: Mapping[str, Any], key: str, param: str | None = None) -> bool | None:
    value = _present(body, key)
    if value is _MISSING:
        return None
    if not isinstance(value, bool):
        raise invalid(param or key, f"{param or key!r} must be a boolean", "invalid_type")
    return value


def opt_int(
    body: Mapping[str, Any], key: str, lo: int | None = None, hi: int | None = None, param: str | None = None
) -> int | None:
    value = _present(body, key)
    if value is _MISSING:
        return None
    name = param or key
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise invalid(name, f"{name!r} must be an integer", "invalid_type")
    if lo is not None and value < lo:
        raise invalid(name, f"{name!r} must be >= {lo}, got {value}", "invalid_value")
    if hi is not None and value > hi:
        raise invalid(name, f"{name!r} must be <= {hi}, got {value}", "invalid_value")
    return value


def opt_float(
    body: Mapping[str, Any],
    key: str,
    lo: float | None = None,
    hi: float | None = None,
    param: str | None = None,
) -> float | None:
    value = _present(body, key)
    if value is _MISSING:
        return None
    name = param or key
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise invalid(name, f"{name!r} must be a finite number", "invalid_type")
    if lo is not None and value < lo:
        raise invalid(name, f"{name!r} must be >= {lo}, got {value}", "invalid_value")
    if hi is not None and value > hi:
        raise invalid(name, f"{name!r} must be <= {hi}, got {value}", "invalid_value")
    return float(value)


def opt_dict(body: Mapping[str, Any], key: str, param: str | None = None) -> dict[str, Any] | None:
    value = _present(body, key)
    if value is _MISSING:
        return None
    if not isinstance(value, dict):
        raise invalid(param or key, f"{param or key!r} must be an object", "invalid_type")
    return value


def opt_list(body: Mapping[str, Any], key: str, param: str | None = None) -> list[Any] | None:
    value = _present(body, key)
    if value is _MISSING:
        return None
    if not isinstance(value, list):
        raise invalid(param or key, f"{param or key!r} must be an array", "invalid_type")
    return value


def req_list(body: Mapping[str, Any], key: str, param: str | None = None, nonempty: bool = True) -> list[Any]:
    value = opt_list(body, key, param)
    name = param or key
    if value is None:
        raise invalid(name, f"missing required parameter: {name!r}", "missing_required_parameter")
    if nonempty and not value:
        raise invalid(name, f"{name!r} must not be empty", "invalid_value")
    return value


def as_dict(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(param, f"{param!r} must be an object", "invalid_type")
    return value


def stop_list(body: Mapping[str, Any], key: str, max_items: int = 16) -> tuple[str, ...]:
    """A stop string or array of stop strings (empty strings rejected)."""
    value = _present(body, key)
    if value is _MISSING:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise invalid(
            key, f"{key!r} must be a non-empty string or an array of non-empty strings", "invalid_type"
        )
    if len(items) > max_items:
        raise invalid(key, f"{key!r} accepts at most {max_items} strings", "invalid_value")
    return tuple(items)
