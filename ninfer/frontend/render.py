"""Sandboxed chat-template rendering with Hugging Face transformers' Jinja semantics.

The environment mirrors `transformers.utils.chat_template_utils` (5.24): an
`ImmutableSandboxedEnvironment` with `trim_blocks`, `lstrip_blocks` and the `loopcontrols`
extension; a `tojson` filter that keeps non-ASCII and takes `indent`/`separators`/`sort_keys`
like `json.dumps`; the globals `raise_exception`, `strftime_now`, a restricted `dict` and a
`namespace` that refuses underscore attributes; and a no-op `{% generation %}` block. Template
variables are plain JSON data: `messages`, `tools`, `documents` (always None here),
`add_generation_prompt`, plus the template keyword arguments.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ninfer.frontend.conversation import ImagePart, Message, TextPart, Tool, VideoPart


class TemplateError(ValueError):
    """The chat template refused the input (its `raise_exception` message) or failed to render.

    The HTTP layer maps it to a 400 error carrying `message`.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _GenerationBlock(jinja2.ext.Extension):
    """Accepts `{% generation %}...{% endgeneration %}` and renders the body unchanged."""

    tags = {"generation"}  # noqa: RUF012  (jinja's class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` for templates without exposing the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A jinja namespace that refuses underscore-prefixed attribute names."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # same signature trick as jinja's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace: {name!r}"
            )


@lru_cache(maxsize=16)
def compile_template(text: str) -> jinja2.Template:
    """Compile a chat template once (cached by its exact text)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    try:
        return env.from_string(text)
    except jinja2.exceptions.TemplateError as exc:
        raise TemplateError(f"chat template does not compile: {exc}") from exc


def render_template(
    template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    **kwargs: Any,
) -> str:
    """Render `template` over plain-data messages; jinja errors become `TemplateError`."""
    compiled = compile_template(template)
    try:
        return compiled.render(
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
    except jinja2.exceptions.TemplateError as exc:
        raise TemplateError(str(exc)) from exc


def tool_to_template(tool: Tool) -> dict[str, Any]:
    """The OpenAI-style function tool dict the Qwen templates print with `tojson`."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    return {"type": "function", "function": function}


def _content_to_template(message: Message) -> str | list[dict[str, Any]]:
    if not message.has_media:
        return message.text
    items: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            items.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            items.append({"type": "image", "image": part.url})
        elif isinstance(part, VideoPart):
            items.append({"type": "video", "video": part.url})
    return items


def message_to_template(message: Message, role: str | None = None) -> dict[str, Any]:
    """The plain dict a Hugging Face chat template expects for one message (None keys omitted).

    Reasoning goes under `reasoning_content` (with transformers' `thinking` alias); tool calls
    in the OpenAI shape `{"id", "type": "function", "function": {"name", "arguments": {...}}}`.
    """
    out: dict[str, Any] = {"role": role or message.role, "content": _content_to_template(message)}
    if message.reasoning is not None:
        out["thinking"] = message.reasoning
        out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out
