"""A JSON Schema `pattern` as xgrammar EBNF for the characters of a JSON string.

xgrammar 0.2.9's own JSON-string regexes are wrong for an optional group holding a repetition:
`^[0-9](?:-[0-9]+)?Z$` takes "112Z" (its plain regex converter, used for raw tool parameters, is
right). This translator replaces them: the pattern is parsed by Python's `re` parser and each
character class becomes the JSON text of its characters, a raw character where JSON allows one
and an escape (`\\"`, `\\\\`, `\\n`, `\\u001f`) where it requires one; each escape counts as one
character, as the decoded string does.

The match is the whole string (as xgrammar reads patterns; `^` and `$` may only stand at the
ends). Case-insensitive flags, lookaround, backreferences and word boundaries are refused
(`PatternRefused`). Classes read the same under Python's and ECMA-262's rules: `\\d`, `\\w`,
`\\s` are their ASCII sets, and a negated class that holds one of them ranges over printable
ASCII only (so `\\D` never yields a digit of another script, which Python's `\\d` would take).
"""

from __future__ import annotations

import re._constants as C
import re._parser as P
from typing import Any

Ranges = list[tuple[int, int]]
UNIVERSE: Ranges = [(0x0, 0xD7FF), (0xE000, 0x10FFFF)]  # every character a string may hold
ASCII: Ranges = [(0x20, 0x7E)]
CATEGORIES: dict[Any, Ranges] = {
    C.CATEGORY_DIGIT: [(0x30, 0x39)],
    C.CATEGORY_WORD: [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    C.CATEGORY_SPACE: [(0x09, 0x0D), (0x20, 0x20)],
}
NEGATED = {C.CATEGORY_NOT_DIGIT: C.CATEGORY_DIGIT, C.CATEGORY_NOT_WORD: C.CATEGORY_WORD,
           C.CATEGORY_NOT_SPACE: C.CATEGORY_SPACE}  # fmt: skip
LINE_ENDS: Ranges = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]  # what `.` does not match
STARTS = {C.AT_BEGINNING, C.AT_BEGINNING_STRING}
ENDS = {C.AT_END, C.AT_END_STRING}
SHORT_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
UNSAFE: Ranges = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]  # JSON writes these only as escapes


class PatternRefused(ValueError):
    """A pattern this translator cannot express exactly."""


def _normal(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _minus(ranges: Ranges, cut: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in _normal(ranges):
        for c_lo, c_hi in _normal(cut):
            if c_hi < lo or c_lo > hi:
                continue
            if c_lo > lo:
                out.append((lo, c_lo - 1))
            lo = c_hi + 1
            if lo > hi:
                break
        if lo <= hi:
            out.append((lo, hi))
    return out


def _intersect(ranges: Ranges, keep: Ranges) -> Ranges:
    return _minus(ranges, _minus(UNIVERSE, keep))


def _char(code: int) -> str:
    """One character inside an EBNF literal or class."""
    if chr(code).isalnum() and code < 0x80:
        return chr(code)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _class(ranges: Ranges) -> list[str]:
    """EBNF alternatives for the JSON text of one character from `ranges`."""
    ranges = _normal(ranges)
    alternatives: list[str] = []
    safe = _minus(ranges, UNSAFE)
    if safe:
        body = "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in safe)
        alternatives.append(f"[{body}]")
    for lo, hi in _intersect(ranges, UNSAFE):
        for code in range(lo, hi + 1):
            escape = SHORT_ESCAPES.get(code, f"\\u{code:04x}")
            alternatives.append('"' + "".join(_char(ord(c)) for c in escape) + '"')
    if not alternatives:
        raise PatternRefused("a character class that matches nothing")
    return alternatives


def _set(items: list[tuple[Any, Any]]) -> Ranges:
    negate = any(op is C.NEGATE for op, _ in items)
    ranges: Ranges = []
    category = False
    for op, av in items:
        if op is C.LITERAL:
            ranges.append((av, av))
        elif op is C.RANGE:
            ranges.append(av)
        elif op is C.CATEGORY:
            category = True
            if av in NEGATED:
                ranges.extend(_minus(ASCII, CATEGORIES[NEGATED[av]]))
            elif av in CATEGORIES:
                ranges.extend(CATEGORIES[av])
            else:
                raise PatternRefused(f"the class {av}")
        elif op is not C.NEGATE:
            raise PatternRefused(f"{op} in a class")
    if not negate:
        return _intersect(ranges, UNIVERSE)
    return _minus(ASCII if category else UNIVERSE, ranges)


class _Emitter:
    def __init__(self, name: str) -> None:
        self.name = name
        self.rules: list[str] = []

    def rule(self, body: str) -> str:
        name = f"{self.name}_{len(self.rules)}"
        self.rules.append(f"{name} ::= {body}")
        return name

    def seq(self, items: Any, first: bool, last: bool) -> str:
        parts: list[str] = []
        items = list(items)
        for i, (op, av) in enumerate(items):
            if op is C.AT:
                if (av in STARTS and first and i == 0) or (av in ENDS and last and i == len(items) - 1):
                    continue
                raise PatternRefused("an anchor or boundary inside the pattern")
            parts.append(self.item(op, av, first and i == 0, last and i == len(items) - 1))
        return "(" + " ".join(parts) + ")" if parts else '""'

    def item(self, op: Any, av: Any, first: bool, last: bool) -> str:
        if op is C.LITERAL:
            return "(" + " | ".join(_class([(av, av)])) + ")"
        if op is C.NOT_LITERAL:
            return "(" + " | ".join(_class(_minus(UNIVERSE, [(av, av)]))) + ")"
        if op is C.ANY:
            return "(" + " | ".join(_class(_minus(UNIVERSE, LINE_ENDS))) + ")"
        if op is C.IN:
            return "(" + " | ".join(_class(_set(av))) + ")"
        if op is C.BRANCH:
            return "(" + " | ".join(self.seq(alt, first, last) for alt in av[1]) + ")"
        if op is C.SUBPATTERN:
            _, add_flags, del_flags, sub = av
            if add_flags or del_flags:
                raise PatternRefused("inline flags")
            return self.seq(sub, first, last)
        if op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
            lo, hi, sub = av
            inner = self.rule(self.seq(sub, False, False))
            return f"{inner}{{{lo},{'' if hi == C.MAXREPEAT else hi}}}"
        if op is C.ATOMIC_GROUP:
            return self.seq(av, first, last)
        raise PatternRefused({C.ASSERT: "lookahead or lookbehind", C.ASSERT_NOT: "lookahead or lookbehind",
                              C.GROUPREF: "a backreference"}.get(op, str(op).lower()))  # fmt: skip


def translate(pattern: str, name: str) -> list[str]:
    """EBNF rules whose first, `name`, matches the JSON text (inside the quotes) of exactly the
    strings that fullmatch `pattern`; raises `PatternRefused`."""
    try:
        parsed = P.parse(pattern)
    except Exception as exc:  # re.error, RecursionError, ...
        raise PatternRefused(f"not a valid regular expression ({exc})") from None
    if parsed.state.flags & (
        C.SRE_FLAG_IGNORECASE | C.SRE_FLAG_MULTILINE | C.SRE_FLAG_DOTALL | C.SRE_FLAG_VERBOSE
    ):
        raise PatternRefused("inline flags")
    emitter = _Emitter(name)
    body = emitter.seq(parsed, True, True)
    return [f"{name} ::= {body}", *emitter.rules]
