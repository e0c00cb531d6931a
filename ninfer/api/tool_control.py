"""Tool choice of all three protocols -> one `ToolControl` -> the answer's grammar.

Chat `tool_choice` / `parallel_tool_calls`, Responses `tool_choice` / `parallel_tool_calls` and
Anthropic `tool_choice` (`disable_parallel_tool_use`) each parse into a `ToolControl`; the
answer's `ConstraintSpec` then combines it with the declared tools (their `strict` flags) and
the request's text format (Chat `response_format`, Responses `text.format`, Anthropic
`output_config.format`):

* no tools, or ``none``: the text format alone (None: unconstrained, today's behaviour).
* ``auto`` with no strict tool, no custom tool with a grammar, parallel calls allowed, no text
  format and no `allowed` restriction: unconstrained.
* otherwise a structural tag (`ninfer.frontend.tool_grammar`): forced calls for ``required``
  and ``named``; for ``auto`` text (or the text format) or calls, strict tools' arguments
  following their schema, custom tools' input their grammar, at most one call when parallel
  calls are off.

`allowed` (OpenAI's ``allowed_tools`` choice) restricts the calls the grammar admits to some of
the declared tools; the prompt still declares them all, so the rendered tool list (and the
prefix cache that holds it) does not change with the choice.

A forced choice without tools, a named tool that is not declared, or an allowed name that is not
declared is a 400 on `param`. An engine that cannot constrain output refuses a constrained
request, except that with --client-compat an ``auto`` constraint (strict tools, one call, custom
tools' grammars) is dropped and recorded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ninfer.api.errors import invalid
from ninfer.engine.types import ConstraintSpec
from ninfer.frontend import tool_grammar
from ninfer.frontend.conversation import Tool

ChoiceMode = Literal["auto", "none", "required", "named"]
TOOLS_PARAM = "tools"  # where a tool schema the grammar compiler refuses is reported


@dataclass(frozen=True)
class Allowed:
    """One tool an ``allowed_tools`` choice lets the model call, and the field that named it."""

    name: str
    param: str


@dataclass(frozen=True)
class ToolControl:
    """One request's tool choice, whatever protocol spelled it."""

    mode: ChoiceMode = "auto"
    name: str | None = None  # the forced tool of ``named``
    parallel: bool = True  # False: at most one call (exactly one when forced)
    param: str = "tool_choice"  # the request field errors name
    allowed: tuple[Allowed, ...] | None = None  # auto / required: calls only to these (None: all)

    def offered(self, tools: list[Tool]) -> list[Tool]:
        """The tools the prompt declares (none under ``none``; all of them under ``allowed``)."""
        return [] if self.mode == "none" else tools

    def callable(self, tools: Sequence[Tool]) -> list[Tool]:
        """The declared tools a call may name (the allowed ones, when restricted)."""
        if self.allowed is None:
            return list(tools)
        names = {a.name for a in self.allowed}
        return [t for t in tools if t.name in names]

    def check(self, tools: Sequence[Tool]) -> None:
        """400 on a forced choice without tools or a named / allowed tool that is not declared."""
        if self.mode in ("required", "named") and not tools:
            raise invalid(
                self.param, f"tool_choice {self.mode!r} needs at least one declared tool", "invalid_value"
            )
        declared = ", ".join(repr(t.name) for t in tools) or "none"
        if self.mode == "named" and all(t.name != self.name for t in tools):
            raise invalid(
                self.param,
                f"tool_choice names {self.name!r}, which is not a declared tool ({declared})",
                "invalid_value",
            )
        for entry in self.allowed or ():
            if all(t.name != entry.name for t in tools):
                raise invalid(
                    entry.param,
                    f"allowed tool {entry.name!r} is not a declared tool (declared: {declared})",
                    "invalid_value",
                )


def allowed_mode(mode: str, param: str) -> Literal["auto", "required"]:
    """The mode of OpenAI's `allowed_tools` choice (Chat and Responses nest it differently)."""
    if mode not in ("auto", "required"):
        raise invalid(param, "mode must be 'auto' or 'required'", "invalid_value")
    return "required" if mode == "required" else "auto"


def _text_format(spec: ConstraintSpec) -> dict[str, object]:
    if spec.kind == "json_schema":
        return tool_grammar.json_format(json.loads(spec.source))
    if spec.kind == "json_object":
        return tool_grammar.json_format(None)
    raise ValueError(f"a text format cannot be a {spec.kind}")


def answer_constraint(
    tools: Sequence[Tool], control: ToolControl, text: ConstraintSpec | None
) -> ConstraintSpec | None:
    """The grammar of the answer (see the module doc); `tools` as offered, `control` checked."""
    if control.mode == "none" or not tools:
        return text
    callable_ = control.callable(tools)
    restricted = {t.name for t in callable_} != {t.name for t in tools}
    free = not any(t.strict or t.grammar is not None for t in tools)
    if control.mode == "auto" and control.parallel and text is None and free and not restricted:
        return None
    if control.mode in ("required", "named"):
        text = None  # the answer is calls only; a text format applies to a later text answer
    tag = tool_grammar.answer_format(
        callable_,
        control.mode,
        single=not control.parallel,
        name=control.name,
        text=_text_format(text) if text is not None else None,
    )
    return ConstraintSpec("structural_tag", json.dumps(tag, ensure_ascii=False), param=TOOLS_PARAM)


def input_formats(tools: Sequence[Tool], params: Sequence[str]) -> tuple[ConstraintSpec, ...]:
    """The custom tools' input grammars on their own (`params`: each tool's format field), to
    compile before the answer's grammar so that a grammar the compiler refuses names its field."""
    return tuple(
        ConstraintSpec(
            "structural_tag",
            json.dumps({"type": "structural_tag", "format": tool_grammar.input_format(tool.grammar)}),
            param=param,
        )
        for tool, param in zip(tools, params, strict=True)
        if tool.grammar is not None
    )


def fallback(control: ToolControl, text: ConstraintSpec | None, compat: bool) -> str | None:
    """With --client-compat, what an engine that cannot constrain output (built without a tokenizer)
    records when it drops a constraint that only enforces strict tools, custom tools' grammars or
    a single call under ``auto``; None: such an engine refuses the request (forced calls, an
    `allowed` restriction, a text format)."""
    if compat and control.mode == "auto" and control.allowed is None and text is None:
        return (
            "strict tool arguments / custom tool input grammars / at most one call not enforced"
            " (this engine cannot constrain output)"
        )
    return None
