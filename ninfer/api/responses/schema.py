"""`POST /v1/responses` and `/v1/responses/input_tokens` bodies -> validated request data.

Every unsupported value is a field-specific 400 (`param` names the field); unknown top-level
fields are `unknown_parameter`; recognized OpenAI features this server does not implement are
`unsupported_parameter` (the field) or `unsupported_value` (the value).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ninfer.api import fields as f
from ninfer.api.chat.request import input_grammar, schema_constraint
from ninfer.api.compat import Compat
from ninfer.api.errors import invalid, unknown_parameter, unsupported
from ninfer.api.parse_guard import guarded
from ninfer.api.responses.items import normalize_input, unsupported_value
from ninfer.api.responses.logprobs import TOP_LOGPROBS_MAX
from ninfer.api.tool_control import Allowed, ToolControl, allowed_mode
from ninfer.engine.types import ConstraintSpec
from ninfer.frontend.conversation import Tool, custom_tool

KNOWN = (
    "model", "input", "instructions", "previous_response_id", "max_output_tokens", "stream", "store",
    "temperature", "top_p", "metadata", "reasoning", "chat_template_kwargs", "preserve_thinking", "text",
    "tools", "tool_choice", "parallel_tool_calls", "truncation", "top_logprobs", "service_tier",
    "background", "include", "stream_options",
    "thinking_budget",  # extension (docs/clients.md)
)  # fmt: skip
# OpenAI Create fields outside the Responses Core; null is treated as absent.
UNSUPPORTED_FIELDS = (
    "conversation", "prompt", "context_management", "moderation", "prompt_cache_key",
    "prompt_cache_retention", "prompt_cache_options", "safety_identifier", "user", "max_tool_calls",
    "background_options", "access_programs", "image",
)  # fmt: skip
# Create fields that change nothing computed here; --client-compat accepts and ignores them.
IGNORABLE_FIELDS = (
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "user",
    "client_metadata",
)
ENCRYPTED_REASONING = "reasoning.encrypted_content"
LOGPROBS_INCLUDE = "message.output_text.logprobs"
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
MIN_OUTPUT_TOKENS = 16
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512


@dataclass
class CreateRequest:
    model: str
    input_items: list[dict[str, Any]]  # normalized, ids assigned
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None  # None: the server's default_max_tokens
    stream: bool = False
    store: bool = True
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    effort: str | None = None
    preserve_thinking: bool | None = None  # explicit value from either spelling, else None
    tools: list[Tool] = field(default_factory=list)
    tool_defs: list[dict[str, Any]] = field(default_factory=list)  # normalized echo for the Response
    tool_formats: list[str] = field(default_factory=list)  # each tool's input-format field (custom)
    tool_choice: str | dict[str, Any] = "auto"  # echoed in the Response
    tool_control: ToolControl = field(default_factory=ToolControl)
    text_format: ConstraintSpec | None = None  # text.format json_object / json_schema
    text_echo: dict[str, Any] = field(default_factory=lambda: {"type": "text"})  # the Response's text.format
    top_logprobs: int = 0  # echoed in the Response
    logprobs: int | None = None  # the engine's alternatives per token; None: no logprobs
    compat: Compat = field(default_factory=Compat)
    thinking_budget: int | None = None  # reasoning tokens allowed (the extension); None: the server's


def _metadata(body: dict[str, Any]) -> dict[str, str]:
    meta = f.opt_dict(body, "metadata") or {}
    if len(meta) > METADATA_PAIRS:
        raise invalid("metadata", f"metadata holds at most {METADATA_PAIRS} pairs", "invalid_value")
    for key, value in meta.items():
        if len(key) > METADATA_KEY:
            raise invalid("metadata", f"metadata keys are at most {METADATA_KEY} characters", "invalid_value")
        if not isinstance(value, str):
            raise invalid(f"metadata.{key}", "metadata values must be strings", "invalid_type")
        if len(value) > METADATA_VALUE:
            raise invalid(
                f"metadata.{key}", f"metadata values are at most {METADATA_VALUE} characters", "invalid_value"
            )
    return dict(meta)


@dataclass
class Tools:
    """The declared tools, their echo for the Response, and each one's input-format field."""

    tools: list[Tool] = field(default_factory=list)
    defs: list[dict[str, Any]] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)


def _tools(body: dict[str, Any], compat: Compat) -> Tools:
    out = Tools()
    for p, tool in f.objects(f.opt_list(body, "tools") or [], "tools"):
        kind = tool.get("type")
        if kind not in ("function", "custom"):
            error = unsupported_value(
                f"{p}.type", f"only flat function and custom tools are supported, not {kind!r}"
            )
            name = tool.get("name") or tool.get("server_label")
            compat.drop_tool(p, error, f"{kind!r} tool {name!r} left out of the prompt")
            continue
        keys = ("parameters", "strict") if kind == "function" else ("format",)
        for key, value in tool.items():
            if key not in ("type", "name", "description", *keys) and value is not None:
                raise unknown_parameter(f"{p}.{key}")
        name = f.req_str(tool, "name", f"{p}.name")
        if any(t.name == name for t in out.tools):
            raise invalid(f"{p}.name", f"duplicate tool name {name!r}", "invalid_value")
        desc = f.opt_str(tool, "description", f"{p}.description")
        if kind == "custom":
            fmt = f.opt_dict(tool, "format", f"{p}.format")
            out.tools.append(custom_tool(name, desc, input_grammar(fmt, f"{p}.format", nested=False)))
            out.defs.append(
                {"type": "custom", "name": name, "description": desc, "format": fmt or {"type": "text"}}
            )
            out.formats.append(f"{p}.format.definition")
            continue
        strict = bool(f.opt_bool(tool, "strict", f"{p}.strict"))
        params = f.opt_dict(tool, "parameters", f"{p}.parameters")
        out.tools.append(Tool(name, desc, params, strict))
        out.defs.append(
            {"type": "function", "name": name, "description": desc, "parameters": params, "strict": strict}
        )
        out.formats.append(p)
    return out


def _allowed_tools(choice: dict[str, Any], parallel: bool) -> tuple[ToolControl, dict[str, Any]]:
    """{"type": "allowed_tools", "mode": "auto" | "required", "tools": [{"type": "function" |
    "custom", "name"}]} -> the control and its echo."""
    f.reject_unknown(choice, ("type", "mode", "tools"), "tool_choice.")
    mode = allowed_mode(f.req_str(choice, "mode", "tool_choice.mode"), "tool_choice.mode")
    allowed = []
    for p, tool in f.objects(f.req_list(choice, "tools", "tool_choice.tools"), "tool_choice.tools"):
        kind = tool.get("type")
        if kind not in ("function", "custom"):
            raise unsupported_value(
                f"{p}.type", f"only function and custom tools can be allowed, not {kind!r}"
            )
        f.reject_unknown(tool, ("type", "name"), f"{p}.")
        allowed.append(Allowed(f.req_str(tool, "name", f"{p}.name"), f"{p}.name"))
    control = ToolControl(mode=mode, parallel=parallel, allowed=tuple(allowed))
    echo = {"type": "allowed_tools", "mode": mode, "tools": [dict(t) for t in choice["tools"]]}
    return control, echo


def _tool_choice(body: dict[str, Any], tools: list[Tool]) -> tuple[ToolControl, str | dict[str, Any]]:
    """`tool_choice` ("auto", "none", "required", {"type": "function" | "custom", "name"},
    {"type": "allowed_tools", ...}) and `parallel_tool_calls` -> the control and the Response's
    echo of the choice."""
    parallel = f.opt_bool(body, "parallel_tool_calls") is not False
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "none", "required"):
        control = ToolControl(mode=choice or "auto", parallel=parallel)
        echo: str | dict[str, Any] = choice or "auto"
    elif isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "allowed_tools":
            control, echo = _allowed_tools(choice, parallel)
        elif kind in ("function", "custom"):
            f.reject_unknown(choice, ("type", "name"), "tool_choice.")
            name = f.req_str(choice, "name", "tool_choice.name")
            control, echo = (
                ToolControl(mode="named", name=name, parallel=parallel),
                {"type": kind, "name": name},
            )
        else:
            raise unsupported_value("tool_choice", f"tool_choice type {kind!r} is not supported")
    else:
        raise invalid(
            "tool_choice", "tool_choice must be 'auto', 'none', 'required' or a function", "invalid_value"
        )
    control.check(control.offered(tools))
    return control, echo


def _text_format(body: dict[str, Any], compat: Compat) -> tuple[ConstraintSpec | None, dict[str, Any]]:
    """`text.format` (text, json_object, json_schema) -> the answer's format and its echo."""
    text = f.opt_dict(body, "text") or {}
    for key, value in text.items():
        if key != "format" and value is not None:
            error = unsupported_value(f"text.{key}", f"text.{key} is not supported")
            if key != "verbosity":
                raise error
            compat.ignore("text.verbosity", error)
    fmt = f.opt_dict(text, "format", "text.format")
    kind = None if fmt is None else fmt.get("type")
    if fmt is None or kind == "text":
        f.reject_unknown(fmt or {}, ("type",), "text.format.")
        return None, {"type": "text"}
    if kind == "json_object":
        f.reject_unknown(fmt, ("type",), "text.format.")
        return ConstraintSpec("json_object", param="text.format"), {"type": "json_object"}
    if kind != "json_schema":
        raise invalid("text.format.type", "text.format.type must be 'text', 'json_object' or 'json_schema'")
    f.reject_unknown(fmt, ("type", "name", "schema", "description", "strict"), "text.format.")
    return schema_constraint(fmt, "text.format"), dict(fmt)


def _reasoning(body: dict[str, Any], compat: Compat) -> str | None:
    reasoning = f.opt_dict(body, "reasoning")
    if reasoning is None:
        return None
    for key, value in reasoning.items():
        if key in ("summary", "generate_summary"):
            if value is not None:
                error = unsupported_value(f"reasoning.{key}", "reasoning summaries are not supported")
                compat.map(f"reasoning.{key}", error, "raw reasoning returned, no summary")
        elif key != "effort" and value is not None:
            raise unknown_parameter(f"reasoning.{key}")
    effort = f.opt_str(reasoning, "effort", "reasoning.effort")
    if effort is not None and effort not in EFFORTS:
        raise invalid(
            "reasoning.effort", f"reasoning.effort must be one of {', '.join(EFFORTS)}", "invalid_value"
        )
    return effort


def _preserve(body: dict[str, Any]) -> bool | None:
    kwargs = f.opt_dict(body, "chat_template_kwargs") or {}
    for key, value in kwargs.items():
        if key != "preserve_thinking" and value is not None:
            raise unknown_parameter(f"chat_template_kwargs.{key}")
    nested = f.opt_bool(kwargs, "preserve_thinking", "chat_template_kwargs.preserve_thinking")
    alias = f.opt_bool(body, "preserve_thinking")
    if nested is not None and alias is not None and nested != alias:
        raise invalid(
            "preserve_thinking",
            "preserve_thinking and chat_template_kwargs.preserve_thinking disagree",
            "conflicting_template_option",
        )
    return alias if alias is not None else nested


def _logprobs(body: dict[str, Any], compat: Compat) -> tuple[int, int | None]:
    """`top_logprobs` (0..20) and `include` -> (the echoed top_logprobs, the engine's count).

    Logprobs are on when `include` holds message.output_text.logprobs (OpenAI's switch) or
    top_logprobs > 0 (asking for alternatives asks for the logprobs they come with; OpenAI returns
    empty lists then). `reasoning.encrypted_content` is ignored under --client-compat (nothing
    encrypted is returned); any other include value is a 400.
    """
    top = f.opt_int(body, "top_logprobs", 0, TOP_LOGPROBS_MAX) or 0
    include = f.opt_list(body, "include") or []
    for i, value in enumerate(include):
        if not isinstance(value, str):
            raise invalid(f"include[{i}]", "include entries must be strings", "invalid_type")
    rest = {value for value in include if value != LOGPROBS_INCLUDE}
    if rest:
        error = unsupported_value("include", f"include may only hold {LOGPROBS_INCLUDE!r}")
        if rest != {ENCRYPTED_REASONING}:
            raise error
        compat.ignore("include", error, "encrypted reasoning is not returned")
    return top, (top if top or LOGPROBS_INCLUDE in include else None)


def _check_unsupported(body: dict[str, Any], stream: bool) -> None:
    truncation = f.opt_str(body, "truncation")
    if truncation not in (None, "disabled"):
        raise unsupported_value("truncation", "truncation must be omitted or 'disabled'")
    tier = f.opt_str(body, "service_tier")
    if tier not in (None, "auto", "default"):
        raise unsupported_value("service_tier", "service_tier must be omitted, 'auto' or 'default'")
    if f.opt_bool(body, "background"):
        raise unsupported_value("background", "background execution is not supported")
    options = f.opt_dict(body, "stream_options")
    if options is not None:
        if not stream:
            raise invalid(
                "stream_options", "stream_options is only allowed with stream=true", "invalid_value"
            )
        f.reject_unknown(options, ("include_obfuscation",), "stream_options.")
        if f.opt_bool(options, "include_obfuscation", "stream_options.include_obfuscation"):
            raise unsupported_value(
                "stream_options.include_obfuscation", "stream obfuscation is not supported"
            )


@guarded
def parse_create(body: dict[str, Any], vision: bool, compat: Compat | None = None) -> CreateRequest:
    """Validate a Create body (the model id is checked by the caller against the server's)."""
    compat = compat or Compat()
    for key, value in body.items():
        if key in UNSUPPORTED_FIELDS or key in IGNORABLE_FIELDS:
            if value is None:
                continue
            error = unsupported(key, f"{key} is not supported by this server")
            if key not in UNSUPPORTED_FIELDS:
                error = unknown_parameter(key)
            if key not in IGNORABLE_FIELDS:
                raise error
            compat.ignore(key, error)
        elif key not in KNOWN:
            raise unknown_parameter(key)
    model = f.req_str(body, "model")
    if body.get("input") is None:
        raise invalid("input", "missing required parameter: 'input'", "missing_required_parameter")
    stream = bool(f.opt_bool(body, "stream"))
    _check_unsupported(body, stream)
    top_logprobs, logprobs = _logprobs(body, compat)
    tools = _tools(body, compat)
    control, choice = _tool_choice(body, tools.tools)
    text_format, text_echo = _text_format(body, compat)
    store = f.opt_bool(body, "store")
    return CreateRequest(
        model=model,
        input_items=normalize_input(body["input"], vision, compat=compat),
        instructions=f.opt_str(body, "instructions"),
        previous_response_id=f.opt_str(body, "previous_response_id"),
        max_output_tokens=f.opt_int(body, "max_output_tokens", MIN_OUTPUT_TOKENS),
        stream=stream,
        store=True if store is None else store,
        temperature=f.opt_float(body, "temperature", 0.0, 2.0),
        top_p=f.opt_float(body, "top_p", 0.0, 1.0),
        metadata=_metadata(body),
        effort=_reasoning(body, compat),
        preserve_thinking=_preserve(body),
        tools=tools.tools,
        tool_defs=tools.defs,
        tool_formats=tools.formats,
        tool_choice=choice,
        tool_control=control,
        text_format=text_format,
        text_echo=text_echo,
        top_logprobs=top_logprobs,
        logprobs=logprobs,
        compat=compat,
        thinking_budget=f.opt_int(body, "thinking_budget", 1),
    )


@guarded
def parse_input_tokens(body: dict[str, Any], vision: bool) -> tuple[str, list[dict[str, Any]]]:
    """`/v1/responses/input_tokens` accepts exactly `model` and `input`."""
    f.reject_unknown(body, ("model", "input"))
    model = f.req_str(body, "model")
    if body.get("input") is None:
        raise invalid("input", "missing required parameter: 'input'", "missing_required_parameter")
    return model, normalize_input(body["input"], vision)
