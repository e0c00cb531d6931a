"""The answer grammar of a turn with tools, as an xgrammar structural tag (plain JSON data).

Calls are written in the chat template's exact form (what `toolcall.parse_block` reads)::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

consecutive calls joined by one newline. A call's parameters follow the tool's `parameters`
schema in xgrammar's ``qwen_xml`` style (declared order, required keys present, a string value
raw, any other value JSON) when the call is forced or the tool is strict; otherwise any
parameters are admitted (the schema ``true``). A custom tool's call is always its one ``input``
parameter, its value the raw input: the tool's grammar (a regex, or a Lark grammar: xgrammar's
``regex`` and ``grammar`` formats) or, without one, any text without ``</parameter>``.

Modes (the protocol adapters map their `tool_choice` spellings onto them):

* ``auto``: free text (or, with a text format, that format) or calls. A ``<tool_call>`` in free
  text must go on as a call to a declared tool. ``single``: at most one call, nothing after it.
* ``required``: only calls, at least one (exactly one when ``single``).
* ``named``: exactly one call, to the named tool.

Forced calls may follow the two newlines the template writes after ``</think>``; the reasoning
before them is not part of this grammar (`ninfer.engine.grammar` keeps it free).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ninfer.frontend.conversation import CUSTOM_INPUT, InputGrammar, Tool

Mode = Literal["auto", "required", "named"]
CALL_START = "<tool_call>"
CALL_SEPARATOR = "\n"
PARAMETER_END = "</parameter>"
ANSWER_LEAD = "\n\n"  # what the template writes between `</think>` and the answer
THINK_MARKERS = ["<think>", "</think>"]  # never part of an answer
# Whitespace runs between markup and values: the template writes single newlines; unbounded runs
# would let a weak model spend its budget on whitespace.
MAX_WHITESPACE = 1


def input_format(grammar: InputGrammar | None) -> dict[str, Any]:
    """A custom tool's input as a structural-tag format (None: any text that cannot end the
    parameter early)."""
    if grammar is None:
        return {"type": "any_text", "excludes": [PARAMETER_END]}
    if grammar.syntax == "regex":
        return {"type": "regex", "pattern": grammar.definition}
    return {"type": "grammar", "grammar": grammar.definition, "syntax": "lark"}


def call_tag(tool: Tool, constrained: bool) -> dict[str, Any]:
    """One `<tool_call>` block of `tool`; `constrained`: its parameters follow its schema (a
    custom tool's input always follows its grammar)."""
    if tool.custom:
        return {
            "type": "tag",
            "begin": f"{CALL_START}\n<function={tool.name}>\n<parameter={CUSTOM_INPUT}>\n",
            "content": input_format(tool.grammar),
            "end": f"\n{PARAMETER_END}\n</function>\n</tool_call>",
        }
    schema: Any = tool.parameters if constrained and tool.parameters is not None else True
    return {
        "type": "tag",
        "begin": f"{CALL_START}\n<function={tool.name}>\n",
        "content": {
            "type": "json_schema",
            "json_schema": schema,
            "style": "qwen_xml",
            "max_whitespace_cnt": MAX_WHITESPACE,
        },
        "end": "\n</function>\n</tool_call>",
    }


def _distinct(tools: Sequence[Tool]) -> list[Tool]:
    """The first tool of each name (a later duplicate could never be told apart in the output)."""
    seen: dict[str, Tool] = {}
    for tool in tools:
        seen.setdefault(tool.name, tool)
    return list(seen.values())


def _forced(tags: list[dict[str, Any]], single: bool) -> dict[str, Any]:
    calls = {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": CALL_SEPARATOR,
        "at_least_one": True,
        "stop_after_first": single,
    }
    lead = {"type": "optional", "content": {"type": "const_string", "value": ANSWER_LEAD}}
    return {"type": "sequence", "elements": [lead, calls]}


def answer_format(
    tools: Sequence[Tool],
    mode: Mode,
    *,
    single: bool = False,
    name: str | None = None,
    text: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The structural tag (`{"type": "structural_tag", "format": ...}`) of the answer.

    `tools`: the declared tools (non-empty; `name` one of them for ``named``). `text`: the
    format an ``auto`` text answer must follow (an xgrammar format, e.g. `json_format(...)`);
    None: free text."""
    tools = _distinct(tools)
    if not tools:
        raise ValueError("a tool grammar needs at least one tool")
    if mode == "named":
        chosen = [t for t in tools if t.name == name]
        if not chosen:
            raise ValueError(f"tool {name!r} is not declared")
        fmt = _forced([call_tag(chosen[0], True)], single=True)
    elif mode == "required":
        fmt = _forced([call_tag(t, True) for t in tools], single)
    else:
        tags = [call_tag(t, t.strict) for t in tools]
        if text is None:
            fmt = {
                "type": "triggered_tags",
                "triggers": [CALL_START],
                "tags": tags,
                "excludes": THINK_MARKERS,
                "stop_after_first": single,
            }
        else:
            fmt = {"type": "or", "elements": [text, _forced(tags, single)]}
    return {"type": "structural_tag", "format": fmt}


def json_format(schema: dict[str, Any] | None) -> dict[str, Any]:
    """A JSON text answer as a structural-tag format (None: any JSON object)."""
    return {
        "type": "json_schema",
        "json_schema": schema if schema is not None else {"type": "object"},
        "max_whitespace_cnt": MAX_WHITESPACE,
    }
