"""OpenAI Chat Completions request -> GenerationJob (schema validation, field-specific 400s)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ninfer.api import fields as f
from ninfer.api import json_body
from ninfer.api.compat import Compat
from ninfer.api.context import ApiContext
from ninfer.api.errors import invalid, unknown_parameter, unsupported
from ninfer.api.events import GenerationJob
from ninfer.api.parse_guard import guarded
from ninfer.api.tool_control import (
    Allowed,
    ToolControl,
    allowed_mode,
    answer_constraint,
    fallback,
    input_formats,
)
from ninfer.engine.config import MAX_LOGPROBS
from ninfer.engine.types import ConstraintSpec, SamplingParams
from ninfer.frontend.conversation import (
    CUSTOM_INPUT,
    Conversation,
    ImagePart,
    InputGrammar,
    Message,
    TextPart,
    Tool,
    ToolCall,
    VideoPart,
    custom_tool,
)
from ninfer.frontend.options import RequestOptions

KNOWN = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "presence_penalty", "frequency_penalty", "seed", "stop", "stream", "stream_options", "tools",
    "tool_choice", "parallel_tool_calls", "reasoning_effort", "enable_thinking", "chat_template_kwargs",
    "preserve_thinking", "n", "user", "logprobs", "top_logprobs", "response_format",
    "prompt_logprobs", "thinking_budget",  # extensions (docs/clients.md)
}  # fmt: skip
# Fields outside the contract that change nothing computed here (prompt caching hints, OpenAI-side
# storage and abuse-monitoring ids); --client-compat accepts and ignores them, otherwise they are
# unknown parameters.
IGNORABLE_FIELDS = ("prompt_cache_key", "prompt_cache_retention", "safety_identifier", "store", "metadata")
SEED_MAX = 2**64 - 1  # the sampler's generators take 64-bit seeds
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


@dataclass
class ChatRequest:
    job: GenerationJob
    model: str
    include_usage: bool


def sampling_params(body: dict[str, Any], max_tokens: int | None) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens or 1,
        temperature=f.opt_float(body, "temperature", 0.0, 2.0),
        top_p=f.opt_float(body, "top_p", 0.0, 1.0),
        top_k=f.opt_int(body, "top_k", 0),
        min_p=f.opt_float(body, "min_p", 0.0, 1.0),
        presence_penalty=f.opt_float(body, "presence_penalty", -2.0, 2.0),
        frequency_penalty=f.opt_float(body, "frequency_penalty", -2.0, 2.0),
        seed=f.opt_int(body, "seed", 0, SEED_MAX),
        stop=f.stop_list(body, "stop"),
    )


def _parts(content: Any, param: str, ctx: ApiContext, allow_media: bool) -> list[Any]:
    if isinstance(content, str):
        return [TextPart(content)]
    if not isinstance(content, list):
        raise invalid(param, f"{param!r} must be a string or an array of content parts", "invalid_type")
    parts: list[Any] = []
    for p, part in f.objects(content, param):
        kind = part.get("type")
        if kind == "text":
            parts.append(TextPart(f.req_str(part, "text", f"{p}.text", nonempty=False)))
        elif kind in ("image_url", "video_url"):
            if not allow_media:
                raise invalid(p, f"{kind} parts are only allowed in user messages", "invalid_value")
            ctx.check_media(p)
            src = part.get(kind)
            url = (
                src
                if isinstance(src, str)
                else f.req_str(f.as_dict(src, f"{p}.{kind}"), "url", f"{p}.{kind}.url")
            )
            parts.append(ImagePart(url) if kind == "image_url" else VideoPart(url))
        else:
            raise invalid(f"{p}.type", f"unsupported content part type {kind!r}", "invalid_value")
    return parts


def _tool_calls(raw: list[Any], param: str) -> list[ToolCall]:
    calls = []
    for p, call in f.objects(raw, param):
        kind = call.get("type", "function")
        if kind == "custom":
            custom = f.as_dict(call.get("custom"), f"{p}.custom")
            name = f.req_str(custom, "name", f"{p}.custom.name")
            text = f.req_str(custom, "input", f"{p}.custom.input", nonempty=False)
            calls.append(ToolCall(f.req_str(call, "id", f"{p}.id"), name, {CUSTOM_INPUT: text}, custom=True))
            continue
        if kind != "function":
            raise invalid(f"{p}.type", "tool calls must be 'function' or 'custom' calls", "invalid_value")
        fn = f.as_dict(call.get("function"), f"{p}.function")
        text = f.req_str(fn, "arguments", f"{p}.function.arguments", nonempty=False)
        try:
            args = json_body.loads(text) if text else {}
        except ValueError as exc:
            raise invalid(
                f"{p}.function.arguments", f"tool call arguments must be a JSON object string ({exc})"
            ) from None
        if not isinstance(args, dict):
            raise invalid(f"{p}.function.arguments", "tool call arguments must be a JSON object")
        calls.append(
            ToolCall(f.req_str(call, "id", f"{p}.id"), f.req_str(fn, "name", f"{p}.function.name"), args)
        )
    return calls


def _message(msg: dict[str, Any], p: str, ctx: ApiContext) -> Message:
    role = msg.get("role")
    content = msg.get("content")
    name = f.opt_str(msg, "name", f"{p}.name")
    if role in ("system", "developer", "tool"):
        if content is None:
            raise invalid(f"{p}.content", f"{role} messages need content", "missing_required_parameter")
        parts = _parts(content, f"{p}.content", ctx, allow_media=role == "tool")
        call_id = f.req_str(msg, "tool_call_id", f"{p}.tool_call_id") if role == "tool" else None
        return Message(role=role, parts=parts, tool_call_id=call_id, name=name)
    if role == "user":
        if content is None:
            raise invalid(f"{p}.content", "user messages need content", "missing_required_parameter")
        return Message(role="user", parts=_parts(content, f"{p}.content", ctx, allow_media=True), name=name)
    if role == "assistant":
        parts = [] if content is None else _parts(content, f"{p}.content", ctx, allow_media=False)
        raw_calls = f.opt_list(msg, "tool_calls", f"{p}.tool_calls") or []
        reasoning = f.opt_str(msg, "reasoning_content", f"{p}.reasoning_content")
        if reasoning is None:
            reasoning = f.opt_str(msg, "reasoning", f"{p}.reasoning")
        calls = _tool_calls(raw_calls, f"{p}.tool_calls")
        return Message(role="assistant", parts=parts, reasoning=reasoning, tool_calls=calls, name=name)
    raise invalid(f"{p}.role", f"unsupported role {role!r}", "invalid_value")


def input_grammar(fmt: dict[str, Any] | None, param: str, nested: bool = True) -> InputGrammar | None:
    """A custom tool's `format` -> its input grammar (None: free text); `param`: the format field.

    Chat nests the grammar ({"type": "grammar", "grammar": {"syntax", "definition"}}), Responses
    does not ({"type": "grammar", "syntax", "definition"}: `nested` False); {"type": "text"} is
    free text. Syntaxes: "lark" and "regex" (both compiled by xgrammar), anything else a 400."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        f.reject_unknown(fmt, ("type",), f"{param}.")
        return None
    if kind != "grammar":
        raise invalid(f"{param}.type", "a custom tool format must be 'text' or 'grammar'", "invalid_value")
    if nested:
        f.reject_unknown(fmt, ("type", "grammar"), f"{param}.")
        param = f"{param}.grammar"
        fmt = f.as_dict(fmt.get("grammar"), param)
        f.reject_unknown(fmt, ("syntax", "definition"), f"{param}.")
    else:
        f.reject_unknown(fmt, ("type", "syntax", "definition"), f"{param}.")
    syntax = f.req_str(fmt, "syntax", f"{param}.syntax")
    if syntax not in ("lark", "regex"):
        raise invalid(
            f"{param}.syntax", f"grammar syntax {syntax!r} is not one of 'lark', 'regex'", "invalid_value"
        )
    definition = f.req_str(fmt, "definition", f"{param}.definition")
    return InputGrammar("lark" if syntax == "lark" else "regex", definition)


def _tools(body: dict[str, Any]) -> tuple[list[Tool], list[str]]:
    """The declared tools and, for each, where its input format is (custom tools)."""
    tools, formats = [], []
    for p, tool in f.objects(f.opt_list(body, "tools") or [], "tools"):
        kind = tool.get("type")
        if kind == "custom":
            spec = f.as_dict(tool.get("custom"), f"{p}.custom")
            f.reject_unknown(spec, ("name", "description", "format"), f"{p}.custom.")
            grammar = input_grammar(f.opt_dict(spec, "format", f"{p}.custom.format"), f"{p}.custom.format")
            desc = f.opt_str(spec, "description", f"{p}.custom.description")
            tools.append(custom_tool(f.req_str(spec, "name", f"{p}.custom.name"), desc, grammar))
            formats.append(f"{p}.custom.format.grammar.definition")
            continue
        if kind != "function":
            raise unsupported(f"{p}.type", "only function and custom tools are supported")
        fn = f.as_dict(tool.get("function"), f"{p}.function")
        strict = bool(f.opt_bool(fn, "strict", f"{p}.function.strict"))
        params = f.opt_dict(fn, "parameters", f"{p}.function.parameters")
        desc = f.opt_str(fn, "description", f"{p}.function.description")
        tools.append(Tool(f.req_str(fn, "name", f"{p}.function.name"), desc, params, strict))
        formats.append(f"{p}.function")
    return tools, formats


def _unknown_fields(body: dict[str, Any], compat: Compat) -> None:
    """Unknown fields fail, except the ignorable ones under --client-compat (null is absent)."""
    for key, value in body.items():
        if key in KNOWN:
            continue
        if key not in IGNORABLE_FIELDS:
            raise unknown_parameter(key)
        if value is not None:
            compat.ignore(key, unknown_parameter(key))


def _allowed_tools(choice: dict[str, Any], parallel: bool) -> ToolControl:
    """{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools":
    [{"type": "function", "function": {"name"}} | {"type": "custom", "custom": {"name"}}]}}."""
    spec = f.as_dict(choice.get("allowed_tools"), "tool_choice.allowed_tools")
    f.reject_unknown(spec, ("mode", "tools"), "tool_choice.allowed_tools.")
    mode = allowed_mode(
        f.req_str(spec, "mode", "tool_choice.allowed_tools.mode"), "tool_choice.allowed_tools.mode"
    )
    allowed = []
    for p, tool in f.objects(
        f.req_list(spec, "tools", "tool_choice.allowed_tools.tools"), "tool_choice.allowed_tools.tools"
    ):
        kind = tool.get("type")
        if kind not in ("function", "custom"):
            raise invalid(f"{p}.type", "allowed tools must be 'function' or 'custom' tools", "invalid_value")
        inner = f.as_dict(tool.get(kind), f"{p}.{kind}")
        allowed.append(Allowed(f.req_str(inner, "name", f"{p}.{kind}.name"), f"{p}.{kind}.name"))
    return ToolControl(mode=mode, parallel=parallel, allowed=tuple(allowed))


def _tool_control(body: dict[str, Any]) -> ToolControl:
    """`tool_choice` ("auto", "none", "required", {"type": "function", "function": {"name"}},
    {"type": "custom", "custom": {"name"}}, {"type": "allowed_tools", ...}) and
    `parallel_tool_calls`."""
    parallel = f.opt_bool(body, "parallel_tool_calls") is not False
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "none", "required"):
        return ToolControl(mode=choice or "auto", parallel=parallel)
    if not isinstance(choice, dict):
        raise invalid(
            "tool_choice",
            "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
            "invalid_value",
        )
    kind = choice.get("type")
    if kind == "allowed_tools":
        return _allowed_tools(choice, parallel)
    if kind not in ("function", "custom"):
        raise unsupported("tool_choice.type", f"tool_choice type {kind!r} is not supported")
    named = f.as_dict(choice.get(kind), f"tool_choice.{kind}")
    return ToolControl(
        mode="named", name=f.req_str(named, "name", f"tool_choice.{kind}.name"), parallel=parallel
    )


def _check_unsupported(body: dict[str, Any]) -> None:
    if f.opt_int(body, "n", 1) not in (None, 1):
        raise unsupported("n", "only n=1 is supported")
    f.opt_str(body, "user")


def response_format(fmt: dict[str, Any] | None, param: str) -> ConstraintSpec | None:
    """OpenAI `response_format` (Chat) -> the answer's grammar (None for text)."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ConstraintSpec("json_object", param=param)
    if kind != "json_schema":
        raise invalid(f"{param}.type", "response_format.type must be 'text', 'json_object' or 'json_schema'")
    spec = f.as_dict(fmt.get("json_schema"), f"{param}.json_schema")
    return schema_constraint(spec, f"{param}.json_schema")


def schema_constraint(spec: dict[str, Any], param: str) -> ConstraintSpec:
    """{name, schema, strict} -> a json_schema constraint; an absent schema admits any JSON."""
    f.req_str(spec, "name", f"{param}.name")
    schema = f.opt_dict(spec, "schema", f"{param}.schema")
    strict = bool(f.opt_bool(spec, "strict", f"{param}.strict"))
    if schema is None:
        return ConstraintSpec("json_object", param=f"{param}.schema")
    return ConstraintSpec("json_schema", json.dumps(schema), strict=strict, param=f"{param}.schema")


def _logprobs(body: dict[str, Any]) -> int | None:
    """`logprobs` / `top_logprobs` (0..20) -> the engine's top count, None when off."""
    top = f.opt_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if not f.opt_bool(body, "logprobs"):
        if top is not None:
            raise invalid("top_logprobs", "top_logprobs requires logprobs=true")
        return None
    return top or 0


def _controls(body: dict[str, Any]) -> RequestOptions:
    effort = f.opt_str(body, "reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise invalid(
            "reasoning_effort", f"reasoning_effort must be one of {', '.join(EFFORTS)}", "invalid_value"
        )
    return RequestOptions(
        effort=effort,
        effort_param="reasoning_effort",
        enable_thinking=f.opt_bool(body, "enable_thinking"),
        preserve_thinking=f.opt_bool(body, "preserve_thinking"),
        chat_template_kwargs=f.opt_dict(body, "chat_template_kwargs"),
    )


@guarded
def parse(body: dict[str, Any], ctx: ApiContext) -> ChatRequest:
    compat = Compat(ctx.client_compat)
    _unknown_fields(body, compat)
    model = f.req_str(body, "model")
    ctx.check_model(model)
    messages = [_message(m, p, ctx) for p, m in f.objects(f.req_list(body, "messages"), "messages")]
    legacy, current = f.opt_int(body, "max_tokens", 1), f.opt_int(body, "max_completion_tokens", 1)
    if legacy is not None and current is not None and legacy != current:
        raise invalid("max_completion_tokens", "max_tokens and max_completion_tokens disagree")
    max_tokens = current if current is not None else legacy
    params = replace(
        sampling_params(body, max_tokens),
        logprobs=_logprobs(body),
        prompt_logprobs=f.opt_int(body, "prompt_logprobs", 0, MAX_LOGPROBS),
        thinking_budget=f.opt_int(body, "thinking_budget", 1),
    )
    stream = bool(f.opt_bool(body, "stream"))
    options = f.opt_dict(body, "stream_options")
    if options is not None and not stream:
        raise invalid("stream_options", "stream_options is only allowed with stream=true")
    f.reject_unknown(options or {}, ("include_usage", "include_obfuscation"), "stream_options.")
    include_usage = bool(f.opt_bool(options or {}, "include_usage", "stream_options.include_usage"))
    _check_unsupported(body)
    control = _tool_control(body)
    declared, formats = _tools(body)
    tools = control.offered(declared)
    control.check(tools)
    text = response_format(f.opt_dict(body, "response_format"), "response_format")
    parts = input_formats(tools, formats) if tools else ()
    job = GenerationJob(
        constraint=answer_constraint(tools, control, text),
        constraint_parts=(*parts, text) if text is not None else parts,
        constraint_fallback=fallback(control, text, compat.enabled),
        protocol="chat_completions",
        conversation=Conversation(messages=messages, tools=tools),
        controls=_controls(body),
        params=params,
        max_tokens_given=max_tokens is not None,
        stream=stream,
        shape={
            "messages": len(messages),
            "tools": len(tools),
            "media_items": sum(1 for m in messages for p in m.parts if isinstance(p, ImagePart | VideoPart)),
            "stream": stream,
        },
        compat=compat.adjustments,
    )
    return ChatRequest(job=job, model=model, include_usage=include_usage)
