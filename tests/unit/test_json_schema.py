"""Schema intake (`ninfer.engine.json_schema`, `ninfer.engine.regex_ebnf`) on a character-level
matcher: every refused schema is a `GrammarError` whose message names the schema path and the
keyword (never a C++ source path); the grammars of the accepted ones admit exactly the JSON
their schema allows, where xgrammar 0.2.9 alone admits more (a raw TAB in a bounded string,
February 31, a string outside an optional group's pattern, a length beside a pattern)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import xgrammar as xgr

from ninfer.api.tool_control import ToolControl, answer_constraint
from ninfer.engine.grammar import GrammarError, Grammars
from ninfer.engine.types import ConstraintSpec
from ninfer.frontend.conversation import Tool
from ninfer.frontend.toolcall import parse_block, typed_arguments

COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)


def _grammars() -> Grammars:
    """The engine's `Grammars` over an empty vocabulary (character-level matching only)."""
    grammars = Grammars("unused", 0, [])
    grammars._compiler = COMPILER
    return grammars


def _accepts(spec: ConstraintSpec, text: str) -> bool:
    matcher = xgr.GrammarMatcher(_grammars().compiled(spec), terminate_without_stop_token=True)
    return bool(matcher.accept_string(text)) and bool(matcher.is_terminated())


def _schema(schema: Any) -> ConstraintSpec:
    return ConstraintSpec("json_schema", json.dumps(schema), param="response_format.json_schema.schema")


def _text(value: Any) -> str:
    """`value` as the grammar writes it (xgrammar's separators, non-ASCII raw)."""
    return json.dumps(value, ensure_ascii=False)


REFUSED = [
    (
        {"type": "object", "properties": {"a": {"type": "strin"}}},
        "properties/a/type: invalid schema: 'strin' is not valid under any of the given schemas",
    ),
    ({"type": "string", "maxLength": -1}, "maxLength: invalid schema: -1 is less than the minimum of 0"),
    ({"properties": {"a": {"maxLength": "abc"}}}, "properties/a/maxLength: invalid schema: 'abc' is not of type 'integer'"),
    ({"items": {"not": {"type": "null"}}}, "items/not: not is not supported by the grammar engine"),
    ({"if": {"type": "integer"}, "then": {"minimum": 0}}, "if: if is not supported by the grammar engine"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems: uniqueItems is not supported by the grammar engine"),
    (
        {"type": "object", "patternProperties": {"^a": {"type": "integer"}}},
        "patternProperties: patternProperties is not supported by the grammar engine",
    ),
    (
        {"$defs": {"u": {"type": "string", "format": "uri"}}, "$ref": "#/$defs/u"},
        "$defs/u/format: format 'uri' is not enforced (enforced: date, date-time, email, ipv4, time, uuid)",
    ),
    (
        {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        "oneOf: oneOf branches 0 and 1 may both match (the grammar cannot exclude that); use anyOf, or"
        " tell them apart by type or by a const / enum property",
    ),
    (
        {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
                   {"properties": {"b": {"type": "string"}}}]},
        "allOf/1: subschemas that constrain the same keyword differently cannot be combined here",
    ),
    ({"allOf": [{"type": "integer"}, {"type": "string"}]}, "allOf/1: subschemas that constrain the same keyword differently cannot be combined here"),
    ({"anyOf": [{"type": "string"}], "oneOf": [{"type": "string"}]}, "oneOf: anyOf together with oneOf is not supported"),
    ({"$ref": "#/$defs/missing"}, "$ref: $ref '#/$defs/missing' does not resolve in this schema"),
    ({"$ref": "https://example.com/s.json"}, "$ref: $ref 'https://example.com/s.json': only local references (#...) are supported"),
    (
        {"$defs": {"n": {"type": "integer", "multipleOf": 2}}, "properties": {"a": {"$ref": "#/$defs/n", "multipleOf": 3}}},
        "properties/a/$ref: subschemas that constrain the same keyword differently cannot be combined here",
    ),
    (
        {"type": "string", "pattern": "^[a-z]+-[0-9]+$", "maxLength": 8},
        "maxLength: maxLength together with a pattern or format that does not bound the length is not supported",
    ),
    ({"type": "string", "pattern": "(?<=a)b"}, "pattern: unsupported pattern: lookahead or lookbehind"),
    ({"type": "string", "pattern": "(a)\\1"}, "pattern: unsupported pattern: a backreference"),
    ({"type": "string", "pattern": "(?i)abc"}, "pattern: unsupported pattern: inline flags"),
    ({"type": "string", "pattern": "a^b"}, "pattern: unsupported pattern: an anchor or boundary inside the pattern"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf: multipleOf is supported on integers only"),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "message"), REFUSED, ids=[m.split(":")[0] for _, m in REFUSED])
def test_refused_schemas_name_the_path_and_keyword(schema: Any, message: str) -> None:
    with pytest.raises(GrammarError) as exc:
        _grammars().compiled(_schema(schema))
    assert (exc.value.param, exc.value.message) == ("response_format.json_schema.schema", message)


def test_engine_errors_lose_the_cpp_location() -> None:
    with pytest.raises(GrammarError) as exc:
        _grammars().compiled(_schema({"type": "object", "properties": {"a": False}, "required": ["a"]}))
    assert exc.value.message.startswith("invalid or unsupported schema: ") and ".cc:" not in exc.value.message


def test_bounded_strings_are_rfc8259() -> None:
    spec = _schema({"type": "string", "minLength": 1, "maxLength": 3})
    assert not _accepts(spec, '"a\tb"')  # a raw TAB (xgrammar alone admits it)
    assert not _accepts(spec, '"a\x01"')
    assert _accepts(spec, '"a\\tb"') and _accepts(spec, '"\\"\\\\"')  # escapes: one character each
    assert not _accepts(spec, '"abcd"') and not _accepts(spec, '""')
    tag = answer_constraint([Tool("f", None, {"type": "object", "properties": {"o": {"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 3}}, "required": ["s"]}}, "required": ["o"]}, True)],
        ToolControl("named", "f"), None)  # fmt: skip
    assert tag is not None
    call = '<tool_call>\n<function=f>\n<parameter=o>\n{{"s": "{}"}}\n</parameter>\n</function>\n</tool_call>'
    assert _accepts(tag, call.format("a\\tb")) and not _accepts(tag, call.format("a\tb"))


DAYS = {"2024-02-29": True, "2023-02-29": False, "2023-02-28": True, "7841-02-31": False, "2024-04-31": False,
        "2024-04-30": True, "2024-12-31": True, "2024-13-01": False, "0000-01-01": False, "2000-02-29": True,
        "1900-02-29": False, "2024-1-01": False}  # fmt: skip


@pytest.mark.parametrize(("day", "valid"), DAYS.items())
def test_dates_have_each_months_days(day: str, valid: bool) -> None:
    assert _accepts(_schema({"type": "string", "format": "date"}), _text(day)) is valid
    assert jsonschema.FormatChecker().conforms(day, "date") is valid  # the grammar agrees with jsonschema


def test_formats_and_patterns_are_exact() -> None:
    times = {
        "10:00:00Z": True,
        "23:59:59.123456+05:30": True,
        "24:00:00Z": False,
        "10:00:00": False,
        "10:0:00Z": False,
    }
    for value, valid in times.items():
        assert _accepts(_schema({"type": "string", "format": "time"}), _text(value)) is valid, value
    stamp = _schema({"type": "string", "format": "date-time"})
    assert _accepts(stamp, '"2024-02-29T10:00:00Z"') and not _accepts(stamp, '"2023-02-29T10:00:00Z"')
    ip = _schema({"type": "string", "format": "ipv4"})
    assert (
        _accepts(ip, '"192.168.0.1"') and not _accepts(ip, '"256.1.1.1"') and not _accepts(ip, '"01.1.1.1"')
    )
    uuid = _schema({"type": "string", "format": "uuid"})
    assert _accepts(uuid, '"123e4567-e89b-12d3-a456-426614174000"') and not _accepts(uuid, '"123e4567"')
    email = _schema({"type": "string", "format": "email", "maxLength": 12})
    assert (
        _accepts(email, '"ab@cd.ef"')
        and not _accepts(email, '"abcdef@ghij.kl"')
        and not _accepts(email, '"ab"')
    )
    optional = _schema({"type": "string", "pattern": "^[0-9](?:-[0-9]+)?Z$"})  # xgrammar alone takes 112Z
    assert _accepts(optional, '"1-23Z"') and _accepts(optional, '"1Z"') and not _accepts(optional, '"112Z"')
    quoted = _schema({"type": "string", "pattern": '^[a"\\\\]{2}$'})  # quote and backslash: escaped
    assert _accepts(quoted, '"a\\""') and _accepts(quoted, '"\\\\a"') and not _accepts(quoted, '"a"a"')
    code = _schema({"type": "string", "pattern": "^[A-Z_]+$", "maxLength": 4})  # rewritten to {1,4}
    assert _accepts(code, '"AB_C"') and not _accepts(code, '"ABCDE"') and not _accepts(code, '""')
    digits = _schema({"type": "string", "pattern": "^\\D$"})  # ASCII only: never another script's digit
    assert _accepts(digits, '"a"') and not _accepts(digits, '"5"') and not _accepts(digits, '"\u0663"')


def test_enums_recursion_and_integer_bounds() -> None:
    enum = _schema({"enum": ["low", "medium", "high"]})
    assert _accepts(enum, '"medium"') and not _accepts(enum, '"medium "')
    tree = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3},
            "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}}, "required": ["name"],
            "additionalProperties": False}  # fmt: skip
    for doc, valid in (
        ({"name": "a", "kids": [{"name": "b", "kids": [{"name": "c"}]}]}, True),
        ({"name": "a", "kids": [{"name": "bbbb"}]}, False),
        ({"name": "a", "kids": [{"name": "b", "x": 1}]}, False),
        ({"name": "a", "kids": [{"name": "b"}, {"name": "c"}, {"name": "d"}]}, False),
    ):
        assert _accepts(_schema(tree), _text(doc)) is valid, doc
        assert jsonschema.Draft202012Validator(tree).is_valid(doc) is valid
    bounds = _schema({"type": "integer", "exclusiveMinimum": 0.5, "maximum": 3.7})  # 1..3
    assert [_accepts(bounds, str(n)) for n in range(5)] == [False, True, True, True, False]
    kinds = _schema({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                               {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}]})  # fmt: skip
    assert _accepts(kinds, '{"k": "b"}')  # disjoint by a const property: accepted


def test_a_ref_enum_parameter_is_read_exactly() -> None:
    """The call grammar may put one whitespace character before `</parameter>`: a pydantic enum
    behind `$ref` loses it (it came back as "medium ")."""
    schema = {"$defs": {"Priority": {"enum": ["low", "medium", "high"], "type": "string"}}, "type": "object",
              "properties": {"priority": {"$ref": "#/$defs/Priority"},
                             "escalate_to": {"anyOf": [{"$ref": "#/$defs/Priority"}, {"type": "null"}]}},
              "required": ["priority", "escalate_to"]}  # fmt: skip
    tool = Tool("file_ticket", None, schema)
    spec = answer_constraint([tool], ToolControl("named", "file_ticket"), None)
    assert spec is not None
    call = ("<tool_call>\n<function=file_ticket>\n<parameter=priority>\nmedium </parameter>\n"
            "<parameter=escalate_to>\thigh\n</parameter>\n</function>\n</tool_call>")  # fmt: skip
    assert _accepts(spec, call)
    block = parse_block(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))
    assert block is not None
    assert typed_arguments(tool, block[1]) == {"priority": "medium", "escalate_to": "high"}


def test_keywords_xgrammar_ignores_are_moved_where_it_reads_them() -> None:
    """xgrammar ignores keywords beside `anyOf` / `$ref`, a second `allOf` subschema and
    type-specific keywords without a `type`: each is merged where it takes effect."""
    cases: list[tuple[Any, list[tuple[str, bool]]]] = [
        ({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 5}]}, [("3", True), ("7", False), ("-1", False)]),
        ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "maximum": 3}, [("3", True), ("4", False)]),
        ({"anyOf": [{"type": "string"}, {"type": "null"}], "maxLength": 2}, [('"ab"', True), ('"abc"', False), ("null", True)]),
        ({"type": "string", "anyOf": [{"maxLength": 2}, {"pattern": "^a+$"}]}, [('"aaaa"', True), ('"abc"', False), ("5", False)]),
        ({"maxLength": 2}, [('"ab"', True), ('"abc"', False)]),
        ({"format": "date"}, [('"2024-02-29"', True), ('"2023-02-29"', False)]),
        ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
          "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, [("{}", False), ('{"b": 1}', True), ('{"a": "x"}', False)]),
    ]  # fmt: skip
    for schema, texts in cases:
        validator = jsonschema.Draft202012Validator(schema)
        for text, valid in texts:
            assert _accepts(_schema(schema), text) is valid, (schema, text)
            if valid:
                assert validator.is_valid(json.loads(text)), (schema, text)
