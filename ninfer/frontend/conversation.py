"""The internal conversation form that every protocol adapter translates into.

Protocol adapters (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages) build one
`Conversation` per request; the frontend renders it with the artifact's chat template.

Mapping rules the adapters follow:

* Order is preserved exactly: messages appear in the order the protocol gave them. Do not move
  a later system or developer instruction to the front, and do not merge consecutive ones;
  the Qwen lowering places each at its own position (see `ninfer.frontend.lower`).
* `role` is one of ``system``, ``developer``, ``user``, ``assistant``, ``tool``. Anthropic's
  top-level ``system`` and Responses' ``instructions`` become a leading ``system`` /
  ``developer`` message respectively; Anthropic ``tool_result`` blocks become ``tool`` messages.
* `parts` hold the visible content in order: `TextPart`, `ImagePart`, `VideoPart`. An assistant
  message may have no parts (a pure tool-call turn). Media are allowed only in ``user`` (and
  ``tool``) messages; the template rejects media in system messages.
* `reasoning` is the raw reasoning text of an assistant turn (OpenAI ``reasoning_content``,
  Anthropic ``thinking`` blocks, Responses ``reasoning`` items), or ``None`` when the client sent
  none. It is never put into `parts`.
* `tool_calls` (assistant only): `ToolCall(id, name, arguments)` with `arguments` already
  decoded to a JSON object (a dict). Adapters decode the protocol's JSON string and reject
  non-object arguments themselves.
* `tool_call_id` / `name` (tool only): the call a result answers, and optionally the function
  name. The Qwen templates do not print them, but they are kept for the protocols.
* `Tool(name, description, parameters, strict)`: a function definition; `parameters` is the
  JSON schema object. The output parser uses it to type generated argument values; `strict`
  (not rendered) constrains a generated call's arguments to it (`ninfer.frontend.tool_grammar`).
* OpenAI custom tools (free-form text input, not JSON) are `custom_tool(name, description,
  grammar)`: to the template a function with one required string parameter ``input`` (its
  description says the input is free-form text, or quotes the grammar it must follow), so the
  model calls them in the same XML form; `grammar` (not rendered apart from that description)
  constrains the generated input. Their calls are `ToolCall(..., {"input": text}, custom=True)`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "developer", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class TextPart:
    """A run of plain text."""

    text: str


@dataclass(frozen=True)
class ImagePart:
    """One image, by URL: ``http(s)://`` or a ``data:`` URI (fetched and decoded by ninfer.media)."""

    url: str


@dataclass(frozen=True)
class VideoPart:
    """One video, by URL: ``http(s)://`` or a ``data:`` URI (fetched and decoded by ninfer.media)."""

    url: str


Part = TextPart | ImagePart | VideoPart


@dataclass(frozen=True)
class ToolCall:
    """A function call made by the assistant; `arguments` is a decoded JSON object (a custom
    tool's call: ``{"input": text}``)."""

    id: str
    name: str
    arguments: dict[str, Any]
    custom: bool = False  # a call to a custom tool: the protocols show `input`, not arguments

    @property
    def input(self) -> str:
        """A custom call's free-form input (its ``input`` argument; other arguments as JSON)."""
        value = self.arguments.get("input")
        if isinstance(value, str) and len(self.arguments) == 1:
            return value
        return json.dumps(self.arguments, ensure_ascii=False) if self.arguments else ""


@dataclass
class Message:
    """One conversation turn in protocol order."""

    role: Role
    parts: list[Part] = field(default_factory=list)
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown message role {self.role!r}; expected one of {ROLES}")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool calls")

    @property
    def text(self) -> str:
        """The concatenated text parts (media parts contribute nothing)."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def has_media(self) -> bool:
        return any(isinstance(p, (ImagePart, VideoPart)) for p in self.parts)


@dataclass(frozen=True)
class InputGrammar:
    """The grammar a custom tool's input must follow (OpenAI `format.grammar`)."""

    syntax: Literal["lark", "regex"]
    definition: str


@dataclass(frozen=True)
class Tool:
    """A client-defined function the model may call; `parameters` is a JSON schema object."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False  # generated arguments constrained to `parameters` (not in the prompt)
    custom: bool = False  # an OpenAI custom tool: one free-form string parameter `CUSTOM_INPUT`
    grammar: InputGrammar | None = None  # a custom tool's input format (None: any text)


CUSTOM_INPUT = "input"  # the one parameter a custom tool shows the template


def custom_tool(name: str, description: str | None, grammar: InputGrammar | None) -> Tool:
    """A custom tool as the template sees it: a function of one required string `input`."""
    if grammar is None:
        about = "The tool's input: free-form text."
    else:
        about = (
            f"The tool's input: text that matches this {grammar.syntax} grammar exactly:\n"
            f"{grammar.definition}"
        )
    parameters = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": about}},
        "required": [CUSTOM_INPUT],
    }
    return Tool(name, description, parameters, custom=True, grammar=grammar)


@dataclass
class Conversation:
    """Ordered messages plus the function tools offered for this request."""

    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)


def text_message(role: Role, text: str, **kwargs: Any) -> Message:
    """Shorthand for a message with a single text part."""
    return Message(role=role, parts=[TextPart(text)], **kwargs)
