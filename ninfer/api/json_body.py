"""Bounded JSON decoding of client text: nesting depth, lone surrogates and non-standard constants.

Every JSON document a client sends (the request body, tool-call argument strings) is decoded here,
so the rules are decided once:

* nesting deeper than `MAX_DEPTH` is refused before decoding, by a scan that never recurses (the
  standard decoder recurses once per level, and later consumers of the value recurse too);
* a string or key holding a lone UTF-16 surrogate (`"\\ud800"` escaped alone) is refused: it is
  not Unicode text, cannot be encoded as UTF-8 and would fail later in the tokenizer or in the
  encoding of an answer that echoes it;
* `NaN`, `Infinity` and `-Infinity` are refused: they are not JSON (RFC 8259), and an answer that
  echoed them would not be JSON either.

Refusals raise `JsonRejected`, a `ValueError`, like every other decoding failure.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

MAX_DEPTH = 64  # arrays and objects nested in one another; tool schemas use far fewer

# A complete JSON string token (escapes included); what remains outside strings is the skeleton.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_STEP = np.zeros(256, dtype=np.int8)  # +1 for an opening bracket, -1 for a closing one, per byte
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_SCAN_CHUNK = 1 << 22  # skeleton bytes per vectorized step (bounds the scan's memory)


class JsonRejected(ValueError):
    """Syntactically plausible JSON this server refuses (too deep, lone surrogate, NaN)."""


def max_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in `text`, without recursion or a parse.

    Brackets inside strings do not count. On malformed text the result is still a bound on what
    a decoder would have to recurse through.
    """
    skeleton = _STRING.sub("", text)
    if skeleton.count("[") + skeleton.count("{") == 0:
        return 0
    raw = np.frombuffer(skeleton.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    depth, deepest = 0, 0
    for start in range(0, raw.size, _SCAN_CHUNK):
        levels = np.cumsum(_STEP[raw[start : start + _SCAN_CHUNK]], dtype=np.int64) + depth
        deepest = max(deepest, int(levels.max()))
        depth = int(levels[-1])
    return deepest


def _no_constants(name: str) -> Any:
    raise JsonRejected(f"{name} is not a JSON value")


def _check_strings(value: Any) -> None:
    """Refuse a lone surrogate in any string or key of a decoded value (iteratively)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise JsonRejected("a string contains a lone UTF-16 surrogate escape (not Unicode text)")
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def loads(text: str, depth_limit: int = MAX_DEPTH) -> Any:
    """`json.loads` with the rules above; raises `ValueError` (`JsonRejected` for a refusal)."""
    brackets = text.count("[") + text.count("{")  # C speed; most bodies stop here
    if brackets > depth_limit and max_depth(text) > depth_limit:
        raise JsonRejected(f"arrays and objects are nested deeper than {depth_limit} levels")
    try:
        value = json.loads(text, parse_constant=_no_constants)
    except RecursionError:  # not reachable after the scan; kept so depth can never become a 500
        raise JsonRejected(f"arrays and objects are nested deeper than {depth_limit} levels") from None
    # A decoded string holds a surrogate only where the text has one raw or escaped (text decoded
    # from strict UTF-8 never has a raw one); valid escaped pairs pass the walk.
    escaped = "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None
    if escaped or (not text.isascii() and _SURROGATE.search(text)):
        _check_strings(value)
    return value
