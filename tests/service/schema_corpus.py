"""A corpus of JSON schemas for constrained-output tests over the random-weight demo model.

Random weights pick among the tokens the grammar allows almost uniformly, so a schema only
finishes in a few tokens when every open-ended part is bounded: strings carry `maxLength`, an
enum, a bounded `pattern` or a bounded `format`; recursion and arrays end with probability about
one half at each step. `CORPUS` holds (name, schema); `TOOLS` holds function tools (object
schemas of the same kinds) for the tool-choice tests.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def obj(props: dict[str, Schema], required: list[str] | None = None, **extra: Any) -> Schema:
    """A closed object; every property required unless `required` says otherwise."""
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
        **extra,
    }


WORD: Schema = {"type": "string", "maxLength": 6}
SHORT: Schema = {"type": "string", "minLength": 1, "maxLength": 3}
DIGIT: Schema = {"type": "integer", "minimum": 0, "maximum": 9}
FLAG: Schema = {"type": "boolean"}
COLOR: Schema = {"enum": ["red", "green", "blue"]}

_SCALARS: list[tuple[str, Schema]] = [
    ("bool", FLAG),
    ("null", {"type": "null"}),
    ("int", {"type": "integer"}),
    ("int-range", {"type": "integer", "minimum": -5, "maximum": 5}),
    ("int-exclusive", {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100}),
    ("number", {"type": "number"}),
    ("number-range", {"type": "number", "minimum": 0, "maximum": 1}),
    ("string-bounded", {"type": "string", "minLength": 2, "maxLength": 5}),
    ("enum-strings", COLOR),
    ("enum-mixed", {"enum": [1, "two", None, True, 3.5]}),
    ("const", {"const": "fixed"}),
    ("pattern-code", {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}),
    ("pattern-alt", {"type": "string", "pattern": "^(yes|no|maybe)$"}),
    ("pattern-hex", {"type": "string", "pattern": "^#[0-9a-f]{6}$"}),
    ("format-date", {"type": "string", "format": "date"}),
    ("format-uuid", {"type": "string", "format": "uuid"}),
    ("format-ipv4", {"type": "string", "format": "ipv4"}),
    ("pattern-version", {"type": "string", "pattern": "^v[0-9]\\.[0-9]{1,2}$"}),
    ("format-date-time", {"type": "string", "format": "date-time"}),
    ("type-union", {"type": ["integer", "null"], "minimum": 0, "maximum": 99}),
]

_OBJECTS: list[tuple[str, Schema]] = [
    ("obj-flag", obj({"ok": FLAG})),
    ("obj-two", obj({"color": COLOR, "n": DIGIT})),
    ("obj-optional", obj({"a": DIGIT, "b": WORD, "c": FLAG}, required=["a"])),
    ("obj-none-required", obj({"x": DIGIT, "y": DIGIT}, required=[])),
    ("obj-nested", obj({"inner": obj({"v": DIGIT, "w": obj({"z": FLAG})})})),
    ("obj-null-field", obj({"tag": {"type": "string", "maxLength": 4}, "v": {"type": "null"}})),
    ("obj-mixed-types", obj({"i": {"type": "integer"}, "f": {"type": "number"}, "s": SHORT, "b": FLAG})),
    ("obj-nullable", obj({"maybe": {"type": ["string", "null"], "maxLength": 3}})),
    ("obj-const", obj({"kind": {"const": "point"}, "x": DIGIT, "y": DIGIT})),
    (
        "obj-formats",
        obj({"day": {"type": "string", "format": "date"}, "id": {"type": "string", "format": "uuid"}}),
    ),
    (
        "obj-patterns",
        obj(
            {
                "code": {"type": "string", "pattern": "^[a-z]{2}[0-9]$"},
                "hex": {"type": "string", "pattern": "^[0-9A-F]{4}$"},
            }
        ),
    ),
    ("obj-min-props", obj({"p": DIGIT, "q": DIGIT, "r": DIGIT}, required=[], minProperties=1)),
    ("obj-deep", obj({"a": obj({"b": obj({"c": obj({"d": COLOR})})})})),
]

_ARRAYS: list[tuple[str, Schema]] = [
    ("array-bools", {"type": "array", "items": FLAG, "minItems": 1, "maxItems": 3}),
    ("array-exact", {"type": "array", "items": DIGIT, "minItems": 2, "maxItems": 2}),
    ("array-unbounded", {"type": "array", "items": COLOR}),
    (
        "array-min",
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 3},
    ),
    ("array-objects", {"type": "array", "items": obj({"k": SHORT, "v": DIGIT}), "maxItems": 3}),
    ("array-tuple", {"type": "array", "prefixItems": [COLOR, DIGIT, FLAG], "items": False}),
    (
        "array-nested",
        {
            "type": "array",
            "items": {"type": "array", "items": DIGIT, "minItems": 1, "maxItems": 2},
            "minItems": 1,
            "maxItems": 2,
        },
    ),
    (
        "obj-with-arrays",
        obj(
            {
                "tags": {"type": "array", "items": WORD, "maxItems": 2},
                "scores": {
                    "type": "array",
                    "items": {"type": "number", "minimum": 0, "maximum": 1},
                    "minItems": 1,
                    "maxItems": 2,
                },
            }
        ),
    ),
    ("array-enums-unique", {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}),
]

# An expression: a digit, or an operation on one or two expressions.
_OP: Schema = obj(
    {
        "op": {"enum": ["+", "*"]},
        "args": {"type": "array", "items": {"$ref": "#/$defs/e"}, "minItems": 1, "maxItems": 2},
    }
)
_EXPR: Schema = {"$defs": {"e": {"anyOf": [DIGIT, _OP]}}, "$ref": "#/$defs/e"}

_COMBINATIONS: list[tuple[str, Schema]] = [
    ("anyof-scalars", {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}, {"type": "null"}]}),
    ("anyof-objects", {"anyOf": [obj({"circle": DIGIT}), obj({"square": obj({"side": DIGIT})})]}),
    ("anyof-in-object", obj({"value": {"anyOf": [FLAG, DIGIT, COLOR]}})),
    (
        "oneof-kinds",
        {"oneOf": [obj({"kind": {"const": "a"}, "a": DIGIT}), obj({"kind": {"const": "b"}, "b": FLAG})]},
    ),
    ("allof-merge", {"allOf": [obj({"x": DIGIT})]}),
    (
        "defs-ref",
        {
            "$defs": {"pt": obj({"x": DIGIT, "y": DIGIT})},
            **obj({"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}}),
        },
    ),
    (
        "definitions-ref",
        {"definitions": {"c": COLOR}, "type": "array", "items": {"$ref": "#/definitions/c"}, "maxItems": 2},
    ),
    (
        "recursive-list",
        {
            "$defs": {
                "node": obj({"v": DIGIT, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}})
            },
            "$ref": "#/$defs/node",
        },
    ),
    (
        "recursive-tree",
        {
            "$defs": {
                "tree": obj(
                    {
                        "label": SHORT,
                        "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "maxItems": 2},
                    },
                    required=["label"],
                )
            },
            "$ref": "#/$defs/tree",
        },
    ),
    ("recursive-root", obj({"name": SHORT, "sub": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}})),
    ("recursive-expr", _EXPR),
]

CORPUS: list[tuple[str, Schema]] = [*_SCALARS, *_OBJECTS, *_ARRAYS, *_COMBINATIONS]

# Function tools: argument schemas of the kinds above (the Qwen XML call writes string values raw).
TOOLS: list[dict[str, Any]] = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": obj(
            {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}}, ["city"]
        ),
    },
    {"name": "add", "description": "Add two digits", "parameters": obj({"a": DIGIT, "b": DIGIT})},
    {
        "name": "tag_items",
        "description": "Tag items",
        "parameters": obj(
            {
                "items": {"type": "array", "items": obj({"id": DIGIT}), "maxItems": 2},
                "note": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]},
            }
        ),
    },
]
