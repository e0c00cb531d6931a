"""Typed readers for request JSON that raise field-specific 400 errors."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ninfer.api import json_body
from ninfer.api.errors import ApiError, invalid, unknown_parameter
from ninfer.api.json_body import JsonRejected

_MISSING = object()


def parse_body(raw: bytes) -> dict[str, Any]:
    """Decode a JSON object body; anything else is a 400 with code `invalid_json`.

    Every POST route reads its body here: invalid UTF-8 and everything `json_body.loads` refuses
    (too deep, lone surrogates, NaN / Infinity) are answered before any field is read.
    """
    try:
        value = json_body.loads(raw.decode("utf-8"))
    except JsonRejected as exc:
        raise ApiError(400, "invalid_json", f"request body is not accepted: {exc}") from None
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


def _required(value: Any, name: str, nonempty: bool) -> Any:
    if value is None:
        raise invalid(name, f"missing required parameter: {name!r}", "missing_required_parameter")
    if nonempty and not value:
        raise invalid(name, f"{name!r} must not be empty", "invalid_value")
    return value


def _checked(value: Any, name: str, kind: type, noun: str) -> Any:
    if not isinstance(value, kind):
        raise invalid(name, f"{name!r} must be {noun}", "invalid_type")
    return value


def _in_range(value: Any, name: str, lo: float | None, hi: float | None) -> Any:
    if lo is not None and value < lo:
        raise invalid(name, f"{name!r} must be >= {lo}, got {value}", "invalid_value")
    if hi is not None and value > hi:
        raise invalid(name, f"{name!r} must be <= {hi}, got {value}", "invalid_value")
    return value


def _opt(body: Mapping[str, Any], key: str, param: str | None, kind: type, noun: str) -> Any:
    """The field's value when present and of `kind`, None when absent or null."""
    value = _present(body, key)
    return None if value is _MISSING else _checked(value, param or key, kind, noun)


def req_str(body: Mapping[str, Any], key: str, param: str | None = None, nonempty: bool = True) -> str:
    return _required(opt_str(body, key, param), param or key, nonempty)


def opt_str(body: Mapping[str, Any], key: str, param: str | None = None) -> str | None:
    return _opt(body, key, param, str, "a string")


def opt_bool(body: Mapping[str, Any], key: str, param: str | None = None) -> bool | None:
    return _opt(body, key, param, bool, "a boolean")


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
    return _in_range(value, name, lo, hi)


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
    return float(_in_range(value, name, lo, hi))


def opt_dict(body: Mapping[str, Any], key: str, param: str | None = None) -> dict[str, Any] | None:
    return _opt(body, key, param, dict, "an object")


def opt_list(body: Mapping[str, Any], key: str, param: str | None = None) -> list[Any] | None:
    return _opt(body, key, param, list, "an array")


def req_list(body: Mapping[str, Any], key: str, param: str | None = None, nonempty: bool = True) -> list[Any]:
    return _required(opt_list(body, key, param), param or key, nonempty)


def as_dict(value: Any, param: str) -> dict[str, Any]:
    return _checked(value, param, dict, "an object")


def objects(values: list[Any], param: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, object) for each element of an array that must hold objects: `param[j]`."""
    for j, raw in enumerate(values):
        path = f"{param}[{j}]"
        yield path, as_dict(raw, path)


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
