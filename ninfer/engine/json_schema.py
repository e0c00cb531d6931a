"""JSON schemas at intake, before xgrammar compiles them: checked, refused where the grammar
cannot enforce them, and rewritten where xgrammar 0.2.9 would admit invalid output.

`rewrite` returns the schema to compile or raises `SchemaRefused`, whose message names the schema
path (JSON-pointer-like, `properties/a/maxLength`) and the keyword:

* the schema must be valid under the Draft 2020-12 meta-schema (`maxLength: -1` is refused);
* enforced keywords: `type`, `enum`, `const`, `properties`, `required`, `additionalProperties`,
  `minProperties` / `maxProperties`, `items`, `prefixItems`, `minItems` / `maxItems`, `minimum` /
  `maximum` / `exclusiveMinimum` / `exclusiveMaximum`, `multipleOf` (integers), `minLength` /
  `maxLength`, `pattern`, `format` (`date`, `time`, `date-time`, `uuid`, `email`, `ipv4`), local
  `$ref` into `$defs` / `definitions` (recursion included), `anyOf`, `oneOf` (branches that
  provably exclude each other), `allOf` (merged into one schema);
* refused: the keywords xgrammar ignores or gets wrong (`not`, `if` / `then` / `else`,
  `uniqueItems`, `patternProperties`, `propertyNames`, `contains`, `dependentRequired`, ...),
  other formats defined by JSON Schema (`uri`, `hostname`, ...), `allOf` subschemas (or keywords
  beside a `$ref` / `anyOf` / `oneOf`) that constrain one keyword in ways that do not combine,
  `oneOf` branches that may overlap, a `$ref` that does not resolve, a length bound beside a
  `pattern` or `format` that does not bound the length itself;
* annotations and unknown keywords (`title`, `description`, `format: int64`, `x-*`) are dropped;
* rewritten: `format` becomes an exact `pattern` (xgrammar's `date` takes 02-31: here each month
  has its own day range and February 29 needs a leap year); `pattern: ^[A-Z]+$` with a length
  bound becomes `^[A-Z]{min,max}$`; integer bounds that are not whole numbers are rounded inward;
  `allOf` is merged, keywords beside a `$ref` go into (a copy of) what it points to and those
  beside `anyOf` / `oneOf` into each branch, and type-specific keywords without a `type` bring
  theirs (xgrammar ignores all of these where they stand).

`json_strings` fixes xgrammar's printed grammar: its length-bounded strings admit raw control
characters (a TAB), which JSON forbids, and its JSON-string regexes admit strings outside their
pattern (`ninfer.engine.regex_ebnf` writes those instead).
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterator
from typing import Any

from ninfer.engine import regex_ebnf

ANNOTATIONS = {"$schema", "$id", "$anchor", "$comment", "$vocabulary", "title", "description",
               "default", "examples", "deprecated", "readOnly", "writeOnly", "contentEncoding",
               "contentMediaType", "contentSchema"}  # fmt: skip
REFUSED = {"not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
           "contains", "minContains", "maxContains", "uniqueItems", "propertyNames",
           "patternProperties", "unevaluatedProperties", "unevaluatedItems", "additionalItems",
           "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"}  # fmt: skip
SCALAR = {"type", "enum", "const", "required", "minItems", "maxItems", "minProperties",
          "maxProperties", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
          "multipleOf", "minLength", "maxLength", "pattern", "format"}  # fmt: skip
SUBSCHEMA = {"additionalProperties", "items"}
TYPE_KEYWORDS = {
    "string": {"minLength", "maxLength", "pattern"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "array": {"items", "prefixItems", "minItems", "maxItems"},
    "object": {"properties", "required", "additionalProperties", "minProperties", "maxProperties"},
}
CONSTRAINING = set().union(*TYPE_KEYWORDS.values(), {"type", "enum", "const", "format"})
LOWER_BOUNDS = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"}
UPPER_BOUNDS = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"}
MAX_INLINED = 64
MERGE_REFUSED = "subschemas that constrain the same keyword differently cannot be combined here"
SCHEMA_LIST = {"prefixItems", "anyOf", "oneOf", "allOf"}
SCHEMA_MAP = {"properties", "$defs", "definitions"}

_YEAR = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001-9999
_LEAP = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    f"(?:{_YEAR}-(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    f"|{_YEAR}-(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    f"|{_YEAR}-02-(?:0[1-9]|1[0-9]|2[0-8])"
    f"|{_LEAP}-02-29)"
)
_HOUR = "(?:[01][0-9]|2[0-3])"
_TIME = f"{_HOUR}:[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{{1,6}})?(?:Z|[+-]{_HOUR}:[0-5][0-9])"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_ATEXT = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
EMAIL_LIMIT = 254  # characters, the practical limit of an address (RFC 3696 errata)


def _email(limit: int) -> str:
    """Addresses of at most `limit` characters: one dot-free local part of at most 64, then 2 to
    4 domain labels (letters, digits, inner hyphens) of at most 63."""
    local = max(1, min(64, (limit - 4) // 3))
    label = max(1, min(63, (limit - local - 2) // 2))
    more = max(1, min(3, (limit - local - 1 - label) // (label + 1)))
    inner = f"(?:[A-Za-z0-9-]{{0,{label - 2}}}[A-Za-z0-9])?" if label > 1 else ""
    part = f"[A-Za-z0-9]{inner}"
    return f"{_ATEXT}{{1,{local}}}@{part}(?:\\.{part}){{1,{more}}}"


FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "email": _email(EMAIL_LIMIT),
    "ipv4": f"(?:{_OCTET}\\.){{3}}{_OCTET}",
}
# the other formats JSON Schema defines: not enforced, so refused (unknown names are annotations)
UNENFORCED_FORMATS = {"ipv6", "hostname", "idn-hostname", "idn-email", "uri", "uri-reference", "iri",
                      "iri-reference", "uri-template", "json-pointer", "relative-json-pointer",
                      "regex", "duration"}  # fmt: skip
# `^ATOM+$` / `^ATOM*$` / `^ATOM{m,n}$`: one character class, escape or character repeated
_REPEAT = re.compile(r"\^?(\[(?:\\.|[^\]\\])+\]|\\[dwsDWS]|[^\\\[\](){}|*+?^$.])(\*|\+|\{(\d+),(\d*)\})\$?")
# xgrammar's counted-string character (raw control characters admitted) and its JSON fix
_COUNTED = re.compile(r'^(\w+) ::= \(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.M)
_COUNTED_FIX = r'\1 ::= (([^\\0-\\x1f\\"\\\\]) | ("\\\\" [\\"\\\\/bfnrt]))'
_CPP_LOCATION = re.compile(r"\[[0-9:]+\] \S+\.(?:cc|h):\d+: ")


class SchemaRefused(ValueError):
    """A schema the grammar cannot enforce; `path` is where (JSON-pointer-like, "" the root)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def _join(path: str, key: str | int) -> str:
    key = str(key).replace("~", "~0").replace("/", "~1")
    return f"{path}/{key}" if path else key


def engine_message(exc: BaseException) -> str:
    """xgrammar's error text without its C++ source location."""
    return _CPP_LOCATION.sub("", str(exc)).strip()


def json_strings(ebnf: str, source: Any) -> str:
    """xgrammar's printed grammar of `source` (a rewritten schema or structural tag) with its
    JSON strings fixed: length-bounded ones without raw control characters (the short escapes
    allowed, one character each), and the `pattern`s of `source` as `regex_ebnf` writes them in
    place of xgrammar's JSON-string regexes."""
    import xgrammar as xgr

    ebnf = _COUNTED.sub(_COUNTED_FIX, ebnf)
    rules: list[str] = []
    for i, pattern in enumerate(sorted(_patterns(source))):
        probe = str(xgr.Grammar.from_json_schema(json.dumps({"type": "string", "pattern": pattern})))
        found = re.search(r"^root_1 ::= (Regex\(.*, json_string=true\))$", probe, re.M)
        if found is None or found.group(1) not in ebnf:
            continue
        name = f"ninfer_pattern_{i}"
        ebnf = ebnf.replace(found.group(1), name)
        rules.extend(regex_ebnf.translate(pattern, name))
    return "\n".join([ebnf.rstrip("\n"), *rules]) + "\n"


def _patterns(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*(_patterns(item) for item in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = (
        {node["pattern"]} if isinstance(node.get("pattern"), str) and node.get("type") != "regex" else set()
    )
    return found.union(*(_patterns(value) for value in node.values()))


def meta_check(schema: Any) -> None:
    """Raise `SchemaRefused` where `schema` breaks the Draft 2020-12 meta-schema."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    error = best_match(Draft202012Validator(Draft202012Validator.META_SCHEMA).iter_errors(schema))
    if error is not None:
        path = ""
        for key in error.absolute_path:
            path = _join(path, key)
        raise SchemaRefused(path, f"invalid schema: {error.message}")


def rewrite(schema: Any) -> Any:
    """The schema to compile (a rewritten copy); raises `SchemaRefused` (see the module doc)."""
    meta_check(schema)
    return _Walk(schema).node(schema, "")


def rewrite_tag(tag: Any) -> Any:
    """A structural tag with each of its JSON schemas rewritten; a refusal names the tool whose
    parameters hold it (or the text format)."""
    if isinstance(tag, list):
        return [rewrite_tag(item) for item in tag]
    if not isinstance(tag, dict):
        return tag
    if tag.get("type") == "json_schema" and "json_schema" in tag:
        return {**tag, "json_schema": rewrite(tag["json_schema"])}
    if tag.get("type") == "tag":
        found = re.search(r"<function=([^>\n]+)>", str(tag.get("begin", "")))
        if found is not None:
            try:
                return {key: rewrite_tag(value) for key, value in tag.items()}
            except SchemaRefused as exc:
                where = f"tool {found.group(1)!r} parameters"
                raise SchemaRefused(f"{where}: {exc.path}" if exc.path else where, exc.message) from None
    return {key: rewrite_tag(value) for key, value in tag.items()}


def _width(pattern: str) -> tuple[int, float]:
    """The (min, max) length of a match of `pattern` in characters (max inf: unbounded)."""
    import re._parser as sre

    lo, hi = sre.parse(pattern).getwidth()
    return int(lo), math.inf if hi >= sre.MAXREPEAT else int(hi)


def _types(schema: dict[str, Any]) -> set[str] | None:
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return set(declared)
    if "const" in schema:
        return {_json_type(schema["const"])}
    if isinstance(schema.get("enum"), list):
        return {_json_type(v) for v in schema["enum"]}
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def _value_key(value: Any) -> str:
    """Equal JSON values have equal keys (1 and 1.0 alike, True apart)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True)


class _Walk:
    """One schema's check and rewrite (`root`: the document local `$ref`s point into)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.inlined = 0  # $refs inlined because of keywords beside them (bounded: recursion)

    def resolve(self, ref: str, path: str) -> Any:
        if not ref.startswith("#"):
            raise SchemaRefused(path, f"$ref {ref!r}: only local references (#...) are supported")
        target = self.root
        for raw in ref[1:].split("/")[1:] if ref != "#" else []:
            key = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and key in target:
                target = target[key]
            elif isinstance(target, list) and key.isdigit() and int(key) < len(target):
                target = target[int(key)]
            else:
                raise SchemaRefused(path, f"$ref {ref!r} does not resolve in this schema")
        return target

    def node(self, schema: Any, path: str) -> Any:
        if isinstance(schema, bool):
            return schema
        schema = self._combine(schema, path)
        out: dict[str, Any] = {}
        for key, value in schema.items():
            at = _join(path, key)
            if key in REFUSED:
                if key == "uniqueItems" and value is False:
                    continue
                raise SchemaRefused(at, f"{key} is not supported by the grammar engine")
            if key in SCALAR:
                out[key] = copy.deepcopy(value)
            elif key in SUBSCHEMA:
                out[key] = self.node(value, at)
            elif key in SCHEMA_LIST:
                out[key] = [self.node(v, _join(at, i)) for i, v in enumerate(value)]
            elif key in SCHEMA_MAP:
                out[key] = {name: self.node(v, _join(at, name)) for name, v in value.items()}
            elif key == "$ref":
                self.resolve(value, at)
                out[key] = value
            # annotations and unknown keywords: dropped
        self._format(out, path)
        self._lengths(out, path)
        self._integer_bounds(out, path)
        if "multipleOf" in out and (
            out.get("type") != "integer" or not float(out["multipleOf"]).is_integer()
        ):
            raise SchemaRefused(_join(path, "multipleOf"), "multipleOf is supported on integers only")
        self._one_of(schema, path)
        return out

    def _combine(self, schema: dict[str, Any], path: str) -> dict[str, Any]:
        """`schema` with its `allOf` merged in, the keywords beside a `$ref` merged into what it
        points to and those beside `anyOf` / `oneOf` into each branch (xgrammar ignores them
        there), and a `type` where only type-specific keywords say it (xgrammar ignores those
        without one)."""
        schema = dict(schema)
        for i, sub in enumerate(schema.pop("allOf", None) or []):
            merged = _merge(schema, sub if sub is not True else {})
            if merged is None:
                raise SchemaRefused(_join(_join(path, "allOf"), i), MERGE_REFUSED)
            schema = merged
        beside = {k: v for k, v in schema.items() if k in CONSTRAINING}
        if "anyOf" in schema and "oneOf" in schema:
            raise SchemaRefused(_join(path, "oneOf"), "anyOf together with oneOf is not supported")
        if "$ref" in schema and beside:
            self.inlined += 1
            if self.inlined > MAX_INLINED:
                raise SchemaRefused(_join(path, "$ref"), "keywords beside a recursive $ref are not supported")
            target = self.resolve(schema.pop("$ref"), _join(path, "$ref"))
            merged = (
                _merge(target if isinstance(target, dict) else {}, schema) if target is not False else None
            )
            if merged is None:
                raise SchemaRefused(_join(path, "$ref"), MERGE_REFUSED)
            return self._combine(merged, path)
        for key in ("anyOf", "oneOf"):
            if key in schema and beside:
                branches: list[Any] = []
                for i, branch in enumerate(schema[key]):
                    if branch is False:
                        branches.append(False)
                        continue
                    both = _merge(branch if isinstance(branch, dict) else {}, beside)
                    if both is None:
                        raise SchemaRefused(_join(_join(path, key), i), MERGE_REFUSED)
                    branches.append(both)
                schema = {k: v for k, v in schema.items() if k not in beside}
                schema[key] = branches
        if not {"type", "enum", "const", "$ref", "anyOf", "oneOf"} & set(schema):
            implied = sorted(t for t, keys in TYPE_KEYWORDS.items() if keys & set(schema))
            if implied:
                schema["type"] = implied[0] if len(implied) == 1 else implied
        return schema

    def _format(self, out: dict[str, Any], path: str) -> None:
        fmt = out.pop("format", None)
        types = _types(out)
        if not isinstance(fmt, str) or (types is not None and "string" not in types):
            return
        at = _join(path, "format")
        if fmt in UNENFORCED_FORMATS:
            raise SchemaRefused(
                at, f"format {fmt!r} is not enforced (enforced: {', '.join(sorted(FORMATS))})"
            )
        if fmt not in FORMATS:
            return  # an unknown format is an annotation
        if "pattern" in out:
            raise SchemaRefused(at, "format together with pattern is not supported")
        limit = out.get("maxLength")
        pattern = (
            _email(limit)
            if fmt == "email" and isinstance(limit, int) and limit < EMAIL_LIMIT
            else FORMATS[fmt]
        )
        out["pattern"] = f"^{pattern}$"
        if types is None:
            out["type"] = "string"  # xgrammar reads a pattern only on a string type

    def _lengths(self, out: dict[str, Any], path: str) -> None:
        pattern = out.get("pattern")
        if not isinstance(pattern, str):
            return
        try:
            regex_ebnf.translate(pattern, "pattern")
        except regex_ebnf.PatternRefused as exc:
            raise SchemaRefused(_join(path, "pattern"), f"unsupported pattern: {exc}") from None
        lo, hi = _width(pattern)
        want_lo, want_hi = out.get("minLength", 0), out.get("maxLength", math.inf)
        if "minLength" not in out and "maxLength" not in out:
            return
        if want_lo <= lo and hi <= want_hi:
            out.pop("minLength", None)  # the pattern bounds the length itself
            out.pop("maxLength", None)
            return
        repeat = _REPEAT.fullmatch(pattern)
        if repeat is not None and pattern.startswith("^") and pattern.endswith("$"):
            atom, quant, q_lo, q_hi = repeat.groups()
            base_lo, base_hi = {"*": (0, math.inf), "+": (1, math.inf)}.get(
                quant, (int(q_lo or 0), int(q_hi) if q_hi else math.inf)
            )
            new_lo, new_hi = max(base_lo, want_lo), min(base_hi, want_hi)
            if new_lo <= new_hi:
                out["pattern"] = f"^{atom}{{{new_lo},{'' if new_hi == math.inf else int(new_hi)}}}$"
                out.pop("minLength", None)
                out.pop("maxLength", None)
                return
        key = "maxLength" if "maxLength" in out else "minLength"
        raise SchemaRefused(
            _join(path, key),
            f"{key} together with a pattern or format that does not bound the length is not supported",
        )

    @staticmethod
    def _integer_bounds(out: dict[str, Any], path: str) -> None:
        if out.get("type") != "integer":
            return
        for key, rounding, shift in (
            ("minimum", math.ceil, 0),
            ("maximum", math.floor, 0),
            ("exclusiveMinimum", math.floor, 1),
            ("exclusiveMaximum", math.ceil, -1),
        ):
            value = out.get(key)
            if isinstance(value, float) and value.is_integer():
                out[key] = int(value)
            elif isinstance(value, float):
                del out[key]
                bound = rounding(value) + shift
                name = key if shift == 0 else ("minimum" if shift > 0 else "maximum")
                other = out.get(name)
                out[name] = bound if other is None else (max if shift > 0 else min)(other, bound)

    def _one_of(self, schema: dict[str, Any], path: str) -> None:
        branches = schema.get("oneOf")
        if not isinstance(branches, list):
            return
        for i, j in _pairs(len(branches)):
            if not self.disjoint(branches[i], branches[j], 0):
                raise SchemaRefused(
                    _join(path, "oneOf"),
                    f"oneOf branches {i} and {j} may both match (the grammar cannot exclude that); use"
                    " anyOf, or tell them apart by type or by a const / enum property",
                )

    def _deref(self, schema: Any, depth: int) -> Any:
        while isinstance(schema, dict) and "$ref" in schema and depth < 16:
            schema = self.resolve(schema["$ref"], "")
            depth += 1
        return schema

    def disjoint(self, a: Any, b: Any, depth: int) -> bool:
        """Whether no value can match both `a` and `b` (False: not provable here)."""
        a, b = self._deref(a, depth), self._deref(b, depth)
        if a is False or b is False:
            return True
        if not isinstance(a, dict) or not isinstance(b, dict) or depth > 8:
            return False
        for one, two in ((a, b), (b, a)):
            subs = one.get("anyOf") or one.get("oneOf")
            if isinstance(subs, list) and subs and all(self.disjoint(s, two, depth + 1) for s in subs):
                return True
        ta, tb = _types(a), _types(b)
        if ta is not None and tb is not None:
            widen = {"integer": {"integer", "number"}, "number": {"integer", "number"}}
            if not any(widen.get(t, {t}) & tb for t in ta):
                return True
        va, vb = _values(a), _values(b)
        if va is not None and vb is not None and not va & vb:
            return True
        shared = set(a.get("required", [])) & set(b.get("required", []))
        pa, pb = a.get("properties") or {}, b.get("properties") or {}
        return any(k in pa and k in pb and self.disjoint(pa[k], pb[k], depth + 1) for k in shared)


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """One schema that takes exactly what both `a` and `b` take, or None where that is not
    plain (a keyword on both sides with values that do not combine)."""
    out = dict(a)
    for key, value in b.items():
        if key not in out or out[key] == value or key in ANNOTATIONS:
            out.setdefault(key, value)
        elif key == "required":
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key in LOWER_BOUNDS or key in UPPER_BOUNDS:
            out[key] = (max if key in LOWER_BOUNDS else min)(out[key], value)
        elif key == "type":
            common = _type_set(out[key]) & _type_set(value)
            if not common:
                return None
            out[key] = sorted(common)[0] if len(common) == 1 else sorted(common)
        elif key == "properties":
            props = dict(out[key])
            for name, sub in value.items():
                if name in props and props[name] != sub:
                    both = (
                        _merge(props[name], sub)
                        if isinstance(props[name], dict) and isinstance(sub, dict)
                        else None
                    )
                    if both is None:
                        return None
                    sub = both
                props[name] = sub
            out[key] = props
        else:
            return None
    for one, two in ((a, b), (b, a)):  # additionalProperties of one side also judges the other's
        if one.get("additionalProperties", True) is not True and set(two.get("properties", {})) - set(
            one.get("properties", {})
        ):
            return None
    return out


def _type_set(declared: Any) -> set[str]:
    types = {declared} if isinstance(declared, str) else set(declared)
    if "number" in types:
        types.add("integer")
    return types


def _values(schema: dict[str, Any]) -> set[str] | None:
    if "const" in schema:
        return {_value_key(schema["const"])}
    if isinstance(schema.get("enum"), list):
        return {_value_key(v) for v in schema["enum"]}
    return None


def _pairs(n: int) -> Iterator[tuple[int, int]]:
    for i in range(n):
        for j in range(i + 1, n):
            yield i, j
