"""Tool choice of all three protocols -> one `ToolControl` -> the answer's grammar.

Chat `tool_choice` / `parallel_tool_calls`, Responses `tool_choice` / `parallel_tool_calls` and
Anthropic `tool_choice` (`disable_parallel_tool_use`) each parse into a `ToolControl`; the
answer's `ConstraintSpec` then combines it with the declared tools (their `strict` flags) and
the request's text format (Chat `response_format`, Responses `text.format`, Anthropic
`output_config.format`):

* no tools, or ``none``: the text format alone (None: unconstrained, today's behaviour).
* ``auto`` with no strict tool, parallel calls allowed and no text format: unconstrained.
* otherwise a structural tag (`ninfer.frontend.tool_grammar`): forced calls for ``required``
  and ``named``; for ``auto`` text (or the text format) or calls, strict tools' arguments
  following their schema, at most one call when parallel calls are off.

A forced choice without tools, or a named tool that is not declared, is a 400 on `param`. An
engine that cannot constrain output refuses a constrained request, except that with
--client-compat an ``auto`` constraint (strict tools, one call) is dropped and recorded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ninfer.api.errors import invalid
from ninfer.engine.api import ConstraintSpec
from ninfer.frontend import tool_grammar
from ninfer.frontend.conversation import Tool

ChoiceMode = Literal["auto", "none", "required", "named"]
TOOLS_PARAM = "tools"  # where a tool schema the grammar compiler refuses is reported


@dataclass(frozen=True)
class ToolControl:
    """One request's tool choice, whatever protocol spelled it."""

    mode: ChoiceMode = "auto"
    name: str | None = None  # the forced tool of ``named``
    parallel: bool = True  # False: at most one call (exactly one when forced)
    param: str = "tool_choice"  # the request field errors name

    def offered(self, tools: list[Tool]) -> list[Tool]:
        """The tools the prompt declares (none under ``none``)."""
        return [] if self.mode == "none" else tools

    def check(self, tools: Sequence[Tool]) -> None:
        """400 on a forced choice without tools or a named tool that is not declared."""
        if self.mode in ("required", "named") and not tools:
            raise invalid(
                self.param, f"tool_choice {self.mode!r} needs at least one declared tool", "invalid_value"
            )
        if self.mode == "named" and all(t.name != self.name for t in tools):
            declared = ", ".join(repr(t.name) for t in tools)
            raise invalid(
                self.param,
                f"tool_choice names {self.name!r}, which is not a declared tool ({declared})",
                "invalid_value",
            )


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
    if control.mode == "auto" and control.parallel and text is None and not any(t.strict for t in tools):
        return None
    if control.mode in ("required", "named"):
        text = None  # the answer is calls only; a text format applies to a later text answer
    tag = tool_grammar.answer_format(
        tools,
        control.mode,
        single=not control.parallel,
        name=control.name,
        text=_text_format(text) if text is not None else None,
    )
    return ConstraintSpec("structural_tag", json.dumps(tag, ensure_ascii=False), param=TOOLS_PARAM)


def fallback(control: ToolControl, text: ConstraintSpec | None, compat: bool) -> str | None:
    """With --client-compat, what an engine that cannot constrain output (built without a tokenizer)
    records when it drops a constraint that only enforces strict tools or a single call under
    ``auto``; None: such an engine refuses the request (forced calls, a text format)."""
    if compat and control.mode == "auto" and text is None:
        return "strict tool arguments / at most one call not enforced (this engine cannot constrain output)"
    return None
