"""Parse one Qwen XML tool-call block and type its parameter values by the tool's JSON schema.

Block grammar (the text between ``<tool_call>`` and ``</tool_call>``; whitespace around the
elements is tolerated)::

    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    ...
    </function>

One newline directly after ``<parameter=KEY>`` and one directly before ``</parameter>`` belong to
the markup (the template writes them) and are removed; everything else is the value. A block
that does not match returns None and the caller flushes it back as text.

Typing: a parameter whose schema type is only ``string`` (or that has no schema) stays the raw
string, except that a value breaking its string schema (enum, const, pattern, format, length)
only by one whitespace character at either end loses it (the schema behind a local ``$ref``
counts, as in pydantic's enums under ``$defs``): a grammar-constrained call (xgrammar's
``qwen_xml`` style) may put any one whitespace character, not only the newline, between the
markup and the value. Otherwise the value is read as JSON (Python's ``True``/``False``/``None`` spellings,
which the Qwen3.5 template writes for scalars, are accepted too) and kept if its JSON type is one
the schema allows (``integer`` also takes an integral float); if not, the raw string is kept.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ninfer.frontend.conversation import Tool

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_FUNCTION_END = re.compile(r"\s*</function>\s*\Z")
_PY_LITERALS = {"True": True, "False": False, "None": None}


def parse_block(body: str) -> tuple[str, list[tuple[str, str]]] | None:
    """(function name, [(key, raw value)]) of a block body, or None when it is malformed."""
    m = _FUNCTION.match(body)
    if m is None or not m.group(1).strip():
        return None
    name = m.group(1).strip()
    pos = m.end()
    params: list[tuple[str, str]] = []
    while True:
        p = _PARAMETER.match(body, pos)
        if p is None:
            break
        key = p.group(1).strip()
        if not key:
            return None
        value = p.group(2)
        if value.startswith("\n"):
            value = value[1:]
        if value.endswith("\n"):
            value = value[:-1]
        params.append((key, value))
        pos = p.end()
    if _FUNCTION_END.match(body, pos) is None:
        return None
    return name, params


def _schema_types(schema: dict[str, Any]) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [t for t in declared if isinstance(t, str)]
    types: list[str] = []
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            if isinstance(sub, dict):
                types.extend(t for t in _schema_types(sub) if t not in types)
    if not types and isinstance(schema.get("enum"), list):
        for value in schema["enum"]:
            t = _json_type(value)
            if t is not None and t not in types:
                types.append(t)
    return types


def _json_type(value: Any) -> str | None:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number" if math.isfinite(value) else None
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return None


def _read(raw: str) -> tuple[bool, Any]:
    text = raw.strip()
    if text in _PY_LITERALS:
        return True, _PY_LITERALS[text]
    try:
        return True, json.loads(text)
    except ValueError:
        return False, None


def _fits(value: str, schema: dict[str, Any]) -> bool:
    """Whether a string meets the checkable parts of its schema (formats: no outer whitespace)."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "const" in schema and value != schema["const"]:
        return False
    if "format" in schema and value != value.strip():
        return False
    if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
        return False
    pattern = schema.get("pattern")
    try:
        return not isinstance(pattern, str) or re.search(pattern, value) is not None
    except re.error:
        return True


def _string(raw: str, schema: dict[str, Any]) -> str:
    """`raw`, or `raw` less one outer whitespace character when only that makes it fit."""
    if _fits(raw, schema):
        return raw
    lead, trail = raw[:1].isspace(), raw[-1:].isspace() and len(raw) > 1
    for cut in (
        raw[1:] if lead else None,
        raw[:-1] if trail else None,
        raw[1:-1] if lead and trail else None,
    ):
        if cut is not None and _fits(cut, schema):
            return cut
    return raw


def _resolved(schema: Any, root: Any) -> Any:
    """`schema` with its local `$ref` chain (and one-subschema `allOf`s, as pydantic writes
    them) followed into `root`: the enum or pattern behind `{"$ref": "#/$defs/Priority"}`."""
    for _ in range(16):
        if not isinstance(schema, dict):
            return schema
        ref = schema.get("$ref")
        subs = schema.get("allOf")
        if isinstance(ref, str) and ref.startswith("#"):
            target: Any = root
            for raw in ref[1:].split("/")[1:]:
                key = raw.replace("~1", "/").replace("~0", "~")
                target = target.get(key) if isinstance(target, dict) else None
            schema = target
        elif isinstance(subs, list) and len(subs) == 1:
            schema = subs[0]
        else:
            return schema
    return schema


def type_value(raw: str, schema: dict[str, Any] | None, root: Any = None) -> Any:
    """The typed value of one parameter given its property schema (see the module doc); `root`:
    the tool's parameters schema, which local `$ref`s point into."""
    schema = _resolved(schema, root)
    if not isinstance(schema, dict):
        return raw
    if isinstance(schema.get("anyOf"), list):
        schema = {**schema, "anyOf": [_resolved(s, root) for s in schema["anyOf"]]}
    if isinstance(schema.get("oneOf"), list):
        schema = {**schema, "oneOf": [_resolved(s, root) for s in schema["oneOf"]]}
    types = [t for t in _schema_types(schema) if t != "string"]
    if not types:
        return _string(raw, schema)
    ok, value = _read(raw)
    if ok:
        kind = _json_type(value)
        for want in types:
            if want == kind:
                return value
            if want == "number" and kind == "integer":
                return value
            if want == "integer" and kind == "number" and float(value).is_integer():
                return int(value)
    return _string(raw, _string_branch(schema))


def _string_branch(schema: dict[str, Any]) -> dict[str, Any]:
    """The part of a schema that a string value must meet (itself, or its first string
    alternative); {} when it allows no string."""
    if "string" in _schema_types(schema) and not any(k in schema for k in ("anyOf", "oneOf")):
        return schema
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            if isinstance(sub, dict) and "string" in _schema_types(sub):
                return _string_branch(sub)
    return {}


def typed_arguments(tool: Tool | None, params: list[tuple[str, str]]) -> dict[str, Any]:
    """Arguments of a call, typed by the tool's `parameters.properties` (last duplicate wins)."""
    props: dict[str, Any] = {}
    if tool is not None and isinstance(tool.parameters, dict):
        found = tool.parameters.get("properties")
        props = found if isinstance(found, dict) else {}
    root = tool.parameters if tool is not None else None
    return {key: type_value(raw, props.get(key), root) for key, raw in params}
