"""One-line configuration errors: the key, the offending value and the valid range."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo

REDACTED = "<redacted>"
SECRET_KEYS = frozenset({"server.api_key"})


class ConfigError(ValueError):
    """An invalid configuration; ``str()`` is one line naming the key, the value and the valid range."""

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        value: str | None = None,
        reason: str | None = None,
        source: str | None = None,
    ) -> None:
        super().__init__(" ".join(message.split()))  # always one line
        self.key = key
        self.value = value
        self.reason = reason
        self.source = source

    @classmethod
    def for_key(cls, key: str, value: Any, reason: str, source: str | None = None) -> ConfigError:
        """``key=value (from source): reason``; secret values are never shown."""
        shown = show_value(key, value)
        origin = f" (from {source})" if source else ""
        return cls(f"{key}={shown}{origin}: {reason}", key=key, value=shown, reason=reason, source=source)


def show_value(key: str, value: Any) -> str:
    """The value as it is written in YAML / overrides, redacted for secrets, on one line."""
    if key in SECRET_KEYS and value is not None:
        return REDACTED
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, SecretStr):
        return REDACTED
    text = str(value)
    if not text or any(ch.isspace() and ch != " " for ch in text):
        return repr(text)
    return text


def _strip_annotated(tp: Any) -> tuple[Any, list[Any]]:
    """(base type, metadata) of a possibly ``Annotated`` type."""
    metadata: list[Any] = []
    while hasattr(tp, "__metadata__"):
        metadata.extend(tp.__metadata__)
        tp = tp.__origin__
    return tp, metadata


def _bounds(metadata: list[Any], real: bool) -> str:
    """`` in 1..8`` / `` in [0, 2]`` / `` >= 0``: the range the constraints in ``metadata`` allow."""
    lo: float | None = None
    hi: float | None = None
    lo_open = hi_open = False
    for m in metadata:
        if not isinstance(m, at.BaseMetadata):
            continue
        for attr, is_lo, is_open in (
            ("ge", True, False),
            ("gt", True, True),
            ("le", False, False),
            ("lt", False, True),
        ):
            bound = getattr(m, attr, None)
            if bound is None:
                continue
            if is_lo:
                lo, lo_open = bound, is_open
            else:
                hi, hi_open = bound, is_open
    if not real:  # integers: closed bounds
        lo = lo + 1 if lo is not None and lo_open else lo
        hi = hi - 1 if hi is not None and hi_open else hi
        lo_open = hi_open = False
    if lo is None and hi is None:
        return ""
    if lo is not None and hi is not None:
        if real:
            return f" in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        return f" in {lo}..{hi}"
    if lo is not None:
        return f" {'>' if lo_open else '>='} {lo:g}" if real else f" >= {lo}"
    return f" {'<' if hi_open else '<='} {hi:g}" if real else f" <= {hi}"


def describe_field(field: FieldInfo) -> str:
    """``must be ...``: the valid values of a settings field, read from its type and constraints."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("valid"), str):
        return str(extra["valid"])
    ann = field.annotation
    members = get_args(ann) if get_origin(ann) in (Union, types.UnionType) else (ann,)
    nullable = type(None) in members
    parts: list[str] = []
    for member in members:
        if member is type(None):
            continue
        base, metadata = _strip_annotated(member)
        metadata = metadata + list(field.metadata)
        if get_origin(base) is Literal:
            parts.append("one of " + ", ".join(str(v) for v in get_args(base)))
        elif base is bool:
            parts.append("true or false")
        elif base is int:
            parts.append("an integer" + _bounds(metadata, real=False))
        elif base is float:
            parts.append("a finite number" + _bounds(metadata, real=True))
        else:
            parts.append("a non-empty string")
    text = " or ".join(parts)
    return f"must be {text}{' or null' if nullable else ''}"


def from_validation_error(
    group: str | None, model: type[BaseModel], exc: ValidationError, sources: dict[str, str] | None = None
) -> ConfigError:
    """The first error of ``exc`` as a ConfigError; ``group`` prefixes field names (None: root model)."""
    err = exc.errors(include_url=False)[0]
    original = (err.get("ctx") or {}).get("error")
    if isinstance(original, ConfigError):  # raised by a model validator with its own message
        return original
    loc = [str(part) for part in err["loc"]]
    if not loc:
        return ConfigError(f"{group or 'settings'}: {err['msg']}")
    name = loc[0]
    key = f"{group}.{name}" if group else ".".join(loc)
    source = (sources or {}).get(key)
    if err["type"] == "extra_forbidden":
        valid = ", ".join(model.model_fields)
        return ConfigError.for_key(key, err["input"], f"unknown key (valid keys of {group}: {valid})", source)
    field = model.model_fields.get(name)
    reason = describe_field(field) if field is not None else err["msg"]
    return ConfigError.for_key(key, err["input"], reason, source)
