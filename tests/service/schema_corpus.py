"""A corpus of JSON schemas for constrained-output tests over the random-weight demo model.

Random weights pick among the tokens the grammar allows almost uniformly, so a schema only
finishes in a few tokens when every open-ended part is bounded: strings carry `maxLength`, an
enum, a bounded `pattern` or a bounded `format`; recursion and arrays end with probability about
one half at each step. `CORPUS` holds (name, schema): keyword-by-keyword cases, then schemas
shaped after public API specs and pydantic models (RFC 9457 problems, invoices, audit events,
GeoJSON, Stripe, Kubernetes, the petstore, JSON-RPC, discriminated unions, recursive trees).
`TOOLS` holds function tools (object schemas of the same kinds) for the tool-choice tests;
`REF_TOOL` a pydantic tool whose enum parameter sits behind a `$ref`.
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

_TEXT: Schema = {"type": "string", "minLength": 1, "maxLength": 8}
_NAME: Schema = {"anyOf": [{"type": "string", "maxLength": 6}, {"type": "null"}]}

# Shaped after public API specs and pydantic models (bounded so random weights finish them).
_REAL_WORLD: list[tuple[str, Schema]] = [
    (  # RFC 9457 problem details, with an API's own error code
        "api-problem",
        obj(
            {
                "type": {"type": "string", "pattern": "^https://errors\\.example\\.com/[a-z-]{1,12}$"},
                "title": _TEXT,
                "status": {"type": "integer", "minimum": 400, "maximum": 599},
                "code": {"type": "string", "pattern": "^[A-Z_]+$", "maxLength": 12},
            },
            required=["type", "status", "code"],
        ),
    ),
    (  # a pydantic invoice: enums and line items under $defs, amounts and dates
        "invoice-pydantic",
        {
            "$defs": {
                "Currency": {"enum": ["EUR", "USD", "GBP"], "title": "Currency", "type": "string"},
                "LineItem": obj(
                    {
                        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$", "title": "Sku"},
                        "quantity": {"type": "integer", "minimum": 1, "maximum": 99, "title": "Quantity"},
                        "unit_price": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
                    },
                    title="LineItem",
                ),
            },
            **obj(
                {
                    "number": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
                    "issued": {"type": "string", "format": "date"},
                    "due": {"type": "string", "format": "date"},
                    "currency": {"$ref": "#/$defs/Currency"},
                    "lines": {
                        "type": "array",
                        "items": {"$ref": "#/$defs/LineItem"},
                        "minItems": 1,
                        "maxItems": 2,
                    },
                },
                title="Invoice",
            ),
        },
    ),
    (  # an audit log event (CloudTrail-like)
        "audit-event",
        obj(
            {
                "id": {"type": "string", "format": "uuid"},
                "at": {"type": "string", "format": "date-time"},
                "actor": obj(
                    {
                        "email": {"type": "string", "format": "email"},
                        "ip": {"type": "string", "format": "ipv4"},
                    }
                ),
                "action": {"enum": ["create", "update", "delete"]},
                "labels": {
                    "type": "object",
                    "additionalProperties": {"type": "string", "maxLength": 4},
                    "maxProperties": 2,
                },
            }
        ),
    ),
    (  # a sign-up form: the password is a bounded free string (no raw control characters)
        "sign-up",
        obj(
            {
                "email": {"type": "string", "format": "email"},
                "password": {"type": "string", "minLength": 8, "maxLength": 10},
                "birthdate": {"type": "string", "format": "date"},
                "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
                "terms": {"const": True},
            }
        ),
    ),
    (  # GeoJSON Point (RFC 7946)
        "geojson-point",
        obj(
            {
                "type": {"const": "Point"},
                "coordinates": {
                    "type": "array",
                    "prefixItems": [
                        {"type": "number", "minimum": -180, "maximum": 180},
                        {"type": "number", "minimum": -90, "maximum": 90},
                    ],
                    "items": False,
                    "minItems": 2,
                },
            }
        ),
    ),
    (  # a flight status record
        "flight",
        obj(
            {
                "flight": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{1,4}$"},
                "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "departs": {"type": "string", "format": "date-time"},
                "gate_time": {"type": "string", "format": "time"},
                "status": {"enum": ["scheduled", "boarding", "departed", "cancelled"]},
            }
        ),
    ),
    (  # a pydantic support ticket: the priority enum behind $ref, an optional user
        "support-ticket-pydantic",
        {
            "$defs": {
                "Priority": {"enum": ["low", "medium", "high"], "title": "Priority", "type": "string"},
                "User": obj({"name": {"type": "string", "maxLength": 6}, "id": DIGIT}, title="User"),
            },
            **obj(
                {
                    "subject": _TEXT,
                    "priority": {"$ref": "#/$defs/Priority"},
                    "assignee": {"anyOf": [{"$ref": "#/$defs/User"}, {"type": "null"}], "default": None},
                    "tags": {"type": "array", "items": {"enum": ["billing", "bug", "ux"]}, "maxItems": 2},
                },
                title="Ticket",
            ),
        },
    ),
    (  # a category tree: the root refers to itself
        "category-tree",
        obj(
            {
                "name": SHORT,
                "children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
            },
            required=["name"],
        ),
    ),
    (  # a GitHub label
        "github-label",
        obj(
            {
                "name": {"type": "string", "minLength": 1, "maxLength": 10},
                "color": {"type": "string", "pattern": "^[0-9a-f]{6}$"},
                "description": _NAME,
            }
        ),
    ),
    (  # a Stripe-like charge: amounts in minor units, a lowercase currency, metadata
        "charge",
        obj(
            {
                "amount": {"type": "integer", "minimum": 50, "maximum": 99999},
                "currency": {"type": "string", "pattern": "^[a-z]{3}$"},
                "captured": FLAG,
                "status": {"enum": ["succeeded", "pending", "failed"]},
                "metadata": {
                    "type": "object",
                    "additionalProperties": {"type": "string", "maxLength": 5},
                    "maxProperties": 1,
                },
            }
        ),
    ),
    (  # a Kubernetes ContainerPort
        "k8s-container-port",
        obj(
            {
                "containerPort": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 65535},
                "protocol": {"enum": ["TCP", "UDP", "SCTP"], "default": "TCP"},
                "name": {"type": "string", "pattern": "^[a-z0-9-]+$", "maxLength": 15},
            },
            required=["containerPort"],
        ),
    ),
    (  # the OpenAPI petstore Pet
        "petstore-pet",
        obj(
            {
                "id": {"type": "integer", "format": "int64", "minimum": 0, "maximum": 9999},
                "name": {"type": "string", "maxLength": 8, "example": "doggie"},
                "status": {
                    "type": "string",
                    "description": "pet status in the store",
                    "enum": ["available", "pending", "sold"],
                },
            },
            required=["name"],
        ),
    ),
    (  # a pydantic discriminated union (Cat | Dog by pet_type)
        "pets-discriminated",
        {
            "$defs": {
                "Cat": obj(
                    {"pet_type": {"const": "cat"}, "lives": {"type": "integer", "minimum": 1, "maximum": 9}}
                ),
                "Dog": obj({"pet_type": {"const": "dog"}, "good": FLAG}),
            },
            "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
            "discriminator": {"propertyName": "pet_type"},
        },
    ),
    (  # a JSON-RPC 2.0 request
        "jsonrpc-request",
        obj(
            {
                "jsonrpc": {"const": "2.0"},
                "method": {"type": "string", "pattern": "^[a-z]{1,6}(\\.[a-z]{1,6})?$"},
                "id": {
                    "anyOf": [
                        {"type": "integer", "minimum": 0, "maximum": 999},
                        {"type": "string", "maxLength": 4},
                    ]
                },
                "params": {"type": "array", "items": DIGIT, "maxItems": 2},
            }
        ),
    ),
    (  # a calendar event: all-day (date) or timed (date-time)
        "calendar-event",
        obj(
            {
                "summary": _TEXT,
                "start": {
                    "anyOf": [
                        obj({"date": {"type": "string", "format": "date"}}),
                        obj({"dateTime": {"type": "string", "format": "date-time"}}),
                    ]
                },
                "attendees": {"type": "array", "items": {"type": "string", "format": "email"}, "maxItems": 1},
            }
        ),
    ),
    (  # a pydantic v1 field: allOf around one $ref, with its description beside; multiples
        "pydantic-v1-allof",
        {
            "definitions": {"Size": {"enum": ["S", "M", "L"], "type": "string"}},
            **obj(
                {
                    "size": {"allOf": [{"$ref": "#/definitions/Size"}], "description": "the size"},
                    "pack": {"type": "integer", "multipleOf": 6, "minimum": 6, "maximum": 48},
                }
            ),
        },
    ),
    (  # a file system tree: files and directories under $defs, recursive
        "file-tree",
        {
            "$defs": {
                "File": obj(
                    {
                        "kind": {"const": "file"},
                        "name": SHORT,
                        "bytes": {"type": "integer", "minimum": 0, "maximum": 999},
                    }
                ),
                "Dir": obj(
                    {
                        "kind": {"const": "dir"},
                        "name": SHORT,
                        "entries": {"type": "array", "items": {"$ref": "#/$defs/Entry"}, "maxItems": 2},
                    }
                ),
                "Entry": {"oneOf": [{"$ref": "#/$defs/File"}, {"$ref": "#/$defs/Dir"}]},
            },
            "$ref": "#/$defs/Dir",
        },
    ),
    (  # OpenAI's function-calling example: a weather query
        "weather-query",
        obj(
            {
                "location": {"type": "string", "minLength": 2, "maxLength": 8},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "hourly": {"type": ["boolean", "null"]},
            },
            required=["location", "unit"],
        ),
    ),
]

CORPUS: list[tuple[str, Schema]] = [*_SCALARS, *_OBJECTS, *_ARRAYS, *_COMBINATIONS, *_REAL_WORLD]

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

# A pydantic tool: the enum behind a $ref (a raw string parameter in the XML call); sampled by
# the property test only (the HTTP tool tests keep the three tools above).
REF_TOOL: dict[str, Any] = {
    "name": "file_ticket",
    "description": "File a support ticket",
    "parameters": {
        "$defs": {"Priority": {"enum": ["low", "medium", "high"], "title": "Priority", "type": "string"}},
        **obj(
            {
                "priority": {"$ref": "#/$defs/Priority"},
                "escalate_to": {"anyOf": [{"$ref": "#/$defs/Priority"}, {"type": "null"}]},
                "title": {"type": "string", "maxLength": 6},
            }
        ),
    },
}
