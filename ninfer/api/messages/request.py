"""Anthropic Messages request -> GenerationJob, including ordered mid-conversation system messages."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ninfer.api import fields as f
from ninfer.api.compat import Compat, nearest_effort
from ninfer.api.context import ApiContext
from ninfer.api.errors import invalid, unknown_parameter, unsupported
from ninfer.api.events import GenerationJob
from ninfer.api.parse_guard import guarded
from ninfer.api.tool_control import ToolControl, answer_constraint, fallback
from ninfer.engine.types import ConstraintSpec, SamplingParams
from ninfer.frontend.conversation import (
    Conversation,
    ImagePart,
    Message,
    Part,
    TextPart,
    Tool,
    ToolCall,
    VideoPart,
)
from ninfer.frontend.options import RequestOptions

KNOWN = {
    "model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p",
    "top_k", "metadata", "tools", "tool_choice", "thinking", "output_config", "preserve_thinking",
    "service_tier",
}  # fmt: skip
COUNT_KNOWN = {
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
    "preserve_thinking",
}
EFFORTS = ("low", "medium", "high", "xhigh", "max")
CLEAR_THINKING = "clear_thinking_"  # context_management edit types that only prune old reasoning


@dataclass
class MessagesRequest:
    job: GenerationJob
    model: str


def _text_blocks(content: Any, param: str) -> list[Part]:
    if isinstance(content, str):
        return [TextPart(content)]
    if not isinstance(content, list):
        raise invalid(param, f"{param!r} must be a string or an array of text blocks", "invalid_type")
    out: list[Part] = []
    for p, block in f.objects(content, param):
        if block.get("type") != "text":
            raise invalid(f"{p}.type", "only text blocks are allowed here", "invalid_value")
        out.append(TextPart(f.req_str(block, "text", f"{p}.text", nonempty=False)))
    return out


def _image(block: dict[str, Any], param: str, ctx: ApiContext) -> ImagePart:
    ctx.check_media(param)
    source = f.as_dict(block.get("source"), f"{param}.source")
    kind = source.get("type")
    if kind == "base64":
        media = f.req_str(source, "media_type", f"{param}.source.media_type")
        return ImagePart(f"data:{media};base64,{f.req_str(source, 'data', f'{param}.source.data')}")
    if kind == "url":
        return ImagePart(f.req_str(source, "url", f"{param}.source.url"))
    raise invalid(f"{param}.source.type", "image source must be base64 or url", "invalid_value")


def _tool_result(block: dict[str, Any], param: str, ctx: ApiContext) -> Message:
    content = block.get("content")
    parts: list[Any] = []
    if isinstance(content, str):
        parts = [TextPart(content)]
    elif isinstance(content, list):
        for p, sub in f.objects(content, f"{param}.content"):
            if sub.get("type") == "text":
                parts.append(TextPart(f.req_str(sub, "text", f"{p}.text", nonempty=False)))
            elif sub.get("type") == "image":
                parts.append(_image(sub, p, ctx))
            else:
                raise invalid(f"{p}.type", "tool results hold text or image blocks", "invalid_value")
    elif content is not None:
        raise invalid(f"{param}.content", "tool result content must be a string or an array", "invalid_type")
    call_id = f.req_str(block, "tool_use_id", f"{param}.tool_use_id")
    return Message(role="tool", parts=parts, tool_call_id=call_id)


def _user(content: Any, param: str, ctx: ApiContext) -> list[Message]:
    """A user turn; its tool_result blocks become tool messages placed in block order."""
    if isinstance(content, str):
        return [Message(role="user", parts=[TextPart(content)])]
    if not isinstance(content, list):
        raise invalid(param, f"{param!r} must be a string or an array of blocks", "invalid_type")
    out: list[Message] = []
    parts: list[Any] = []
    for p, block in f.objects(content, param):
        kind = block.get("type")
        if kind == "tool_result":
            if parts:
                out.append(Message(role="user", parts=parts))
                parts = []
            out.append(_tool_result(block, p, ctx))
        elif kind == "text":
            parts.append(TextPart(f.req_str(block, "text", f"{p}.text", nonempty=False)))
        elif kind == "image":
            parts.append(_image(block, p, ctx))
        else:
            raise invalid(f"{p}.type", f"unsupported user content block {kind!r}", "invalid_value")
    if parts or not out:
        out.append(Message(role="user", parts=parts))
    return out


def _assistant(content: Any, param: str) -> Message:
    if isinstance(content, str):
        return Message(role="assistant", parts=[TextPart(content)])
    if not isinstance(content, list):
        raise invalid(param, f"{param!r} must be a string or an array of blocks", "invalid_type")
    parts: list[Any] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for p, block in f.objects(content, param):
        kind = block.get("type")
        if kind == "text":
            parts.append(TextPart(f.req_str(block, "text", f"{p}.text", nonempty=False)))
        elif kind == "thinking":
            reasoning.append(f.req_str(block, "thinking", f"{p}.thinking", nonempty=False))
        elif kind == "tool_use":
            args = f.as_dict(block.get("input"), f"{p}.input")
            calls.append(
                ToolCall(f.req_str(block, "id", f"{p}.id"), f.req_str(block, "name", f"{p}.name"), args)
            )
        else:
            raise invalid(f"{p}.type", f"unsupported assistant content block {kind!r}", "invalid_value")
    return Message(
        role="assistant", parts=parts, reasoning="".join(reasoning) if reasoning else None, tool_calls=calls
    )


def _check_system_placement(roles: list[str]) -> None:
    """A system section follows a user turn and is final or immediately precedes an assistant turn."""
    i = 0
    while i < len(roles):
        if roles[i] != "system":
            i += 1
            continue
        end = i
        while end < len(roles) and roles[end] == "system":
            end += 1
        if i == 0 or roles[i - 1] != "user":
            raise invalid(f"messages[{i}]", "a system message must follow a user or tool-result message")
        if end < len(roles) and roles[end] != "assistant":
            raise invalid(
                f"messages[{i}]", "a system message must be last or immediately precede an assistant message"
            )
        i = end


def conversation(body: dict[str, Any], ctx: ApiContext, compat: Compat) -> tuple[Conversation, int]:
    """The conversation and the number of protocol messages."""
    raw_messages = f.req_list(body, "messages")
    out: list[Message] = []
    system = body.get("system")
    if system is not None and system != "" and system != []:
        out.append(Message(role="system", parts=_text_blocks(system, "system")))
    roles: list[str] = []
    for p, msg in f.objects(raw_messages, "messages"):
        role, content = msg.get("role"), msg.get("content")
        if content is None:
            raise invalid(f"{p}.content", "missing required parameter", "missing_required_parameter")
        roles.append(role if isinstance(role, str) else "")
        if role == "user":
            out.extend(_user(content, f"{p}.content", ctx))
        elif role == "assistant":
            out.append(_assistant(content, f"{p}.content"))
        elif role == "system":
            out.append(Message(role="system", parts=_text_blocks(content, f"{p}.content")))
        else:
            raise invalid(f"{p}.role", f"unsupported role {role!r}", "invalid_value")
    _check_system_placement(roles)
    control = tool_control(body)
    tools = control.offered(_tools(body, compat))
    control.check(tools)
    _note_cache_control(body, compat)
    return Conversation(messages=out, tools=tools), len(raw_messages)


def _note_cache_control(body: dict[str, Any], compat: Compat) -> None:
    """Prompt-caching breakpoints change nothing here (prefix reuse is automatic)."""
    blocks: list[Any] = []
    for key in ("system", "tools"):
        if isinstance(body.get(key), list):
            blocks.extend(body[key])
    for msg in body.get("messages") or []:
        if isinstance(msg, dict) and isinstance(msg.get("content"), list):
            blocks.extend(msg["content"])
    if any(isinstance(b, dict) and b.get("cache_control") is not None for b in blocks):
        compat.note("cache_control", "prompt-cache breakpoints ignored; prefix reuse is automatic")


def _tools(body: dict[str, Any], compat: Compat) -> list[Tool]:
    tools = []
    for p, tool in f.objects(f.opt_list(body, "tools") or [], "tools"):
        if tool.get("type") not in (None, "custom"):
            error = unsupported(f"{p}.type", "only client-defined tools are supported")
            compat.drop_tool(p, error, f"server tool {tool.get('type')!r} ({tool.get('name')!r}) left out")
            continue
        schema = f.opt_dict(tool, "input_schema", f"{p}.input_schema")
        tools.append(
            Tool(
                f.req_str(tool, "name", f"{p}.name"),
                f.opt_str(tool, "description", f"{p}.description"),
                schema,
                bool(f.opt_bool(tool, "strict", f"{p}.strict")),
            )
        )
    return tools


def tool_control(body: dict[str, Any]) -> ToolControl:
    """`tool_choice` {"type": auto | any | tool | none, "name", "disable_parallel_tool_use"}."""
    choice = f.opt_dict(body, "tool_choice")
    if choice is None:
        return ToolControl()
    f.reject_unknown(choice, ("type", "name", "disable_parallel_tool_use"), "tool_choice.")
    single = f.opt_bool(choice, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use")
    parallel = not single
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return ToolControl(mode=kind, parallel=parallel)
    if kind == "any":
        return ToolControl(mode="required", parallel=parallel)
    if kind == "tool":
        return ToolControl(
            mode="named", name=f.req_str(choice, "name", "tool_choice.name"), parallel=parallel
        )
    raise invalid("tool_choice.type", "tool_choice.type must be auto, any, tool or none", "invalid_value")


def output_format(body: dict[str, Any]) -> ConstraintSpec | None:
    """`output_config.format` {"type": "json_schema", "schema"} -> the answer's format."""
    fmt = f.opt_dict(f.opt_dict(body, "output_config") or {}, "format", "output_config.format")
    if fmt is None:
        return None
    f.reject_unknown(fmt, ("type", "schema"), "output_config.format.")
    if fmt.get("type") != "json_schema":
        raise invalid(
            "output_config.format.type", "output_config.format.type must be 'json_schema'", "invalid_value"
        )
    schema = f.as_dict(fmt.get("schema"), "output_config.format.schema")
    return ConstraintSpec("json_schema", json.dumps(schema), strict=True, param="output_config.format.schema")


def _thinking(body: dict[str, Any], compat: Compat) -> str | None:
    thinking = f.opt_dict(body, "thinking")
    if thinking is None:
        return None
    kind = f.req_str(thinking, "type", "thinking.type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise invalid("thinking.type", "thinking.type must be enabled, disabled or adaptive", "invalid_value")
    if kind == "adaptive":
        compat.note("thinking.type", "'adaptive' -> thinking on (no budget)")
    if thinking.get("display") is not None:
        compat.note("thinking.display", "reasoning is returned as generated")
    return kind


def thinking_budget(body: dict[str, Any]) -> int | None:
    """`thinking.budget_tokens` of an enabled thinking: the reasoning tokens allowed (enforced by
    the engine: the reasoning is closed there and the answer follows); None otherwise."""
    thinking = f.opt_dict(body, "thinking") or {}
    if thinking.get("type") != "enabled":
        return None
    return f.opt_int(thinking, "budget_tokens", 1, None, "thinking.budget_tokens")


def _effort(body: dict[str, Any], ctx: ApiContext, compat: Compat) -> tuple[str | None, bool]:
    """The effort to resolve and whether compatibility mapping turned thinking on."""
    config = f.opt_dict(body, "output_config") or {}
    f.reject_unknown(config, ("effort", "format"), "output_config.")
    effort = f.opt_str(config, "effort", "output_config.effort")
    if effort is not None and effort not in EFFORTS:
        raise invalid("output_config.effort", f"effort must be one of {', '.join(EFFORTS)}", "invalid_value")
    exposed = ctx.template_efforts()
    if effort is None or not compat.enabled or effort in exposed:
        return effort, False
    nearest = nearest_effort(effort, exposed)
    compat.map("output_config.effort", invalid(None, ""), f"{effort!r} -> {nearest!r}, thinking on")
    return nearest, True


def controls(body: dict[str, Any], ctx: ApiContext, compat: Compat) -> RequestOptions:
    kind = _thinking(body, compat)
    effort, forced = _effort(body, ctx, compat)
    if forced and kind in (None, "disabled"):
        kind = "enabled"
    return RequestOptions(
        effort=effort,
        effort_param="output_config.effort",
        thinking_type=kind,
        preserve_thinking=f.opt_bool(body, "preserve_thinking"),
    )


def _unknown_fields(body: dict[str, Any], known: set[str], compat: Compat) -> None:
    """Unknown top-level fields fail, except clear-thinking context management under --client-compat."""
    for key in body:
        if key in known:
            continue
        if key == "context_management" and _clears_thinking_only(body[key]):
            compat.ignore(key, unknown_parameter(key), "clear-thinking edits ignored (no server-side edits)")
        else:
            raise unknown_parameter(key)


def _clears_thinking_only(value: Any) -> bool:
    if not isinstance(value, dict) or set(value) - {"edits"} or not isinstance(value.get("edits"), list):
        return False
    return all(
        isinstance(e, dict) and str(e.get("type", "")).startswith(CLEAR_THINKING) for e in value["edits"]
    )


def _metadata(body: dict[str, Any], compat: Compat) -> None:
    meta = f.opt_dict(body, "metadata")
    if meta and meta.get("user_id") is not None:
        compat.note("metadata.user_id")


@guarded
def parse(body: dict[str, Any], ctx: ApiContext, compat: Compat | None = None) -> MessagesRequest:
    compat = compat or Compat(ctx.client_compat)
    _unknown_fields(body, KNOWN, compat)
    model = f.req_str(body, "model")  # a response label; it does not select the artifact
    max_tokens = f.opt_int(body, "max_tokens", 1)
    if max_tokens is None:
        raise invalid("max_tokens", "missing required parameter: 'max_tokens'", "missing_required_parameter")
    conv, count = conversation(body, ctx, compat)
    _metadata(body, compat)
    stream = bool(f.opt_bool(body, "stream"))
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=f.opt_float(body, "temperature", 0.0, 1.0),
        top_p=f.opt_float(body, "top_p", 0.0, 1.0),
        top_k=f.opt_int(body, "top_k", 0),
        stop=f.stop_list(body, "stop_sequences"),
        thinking_budget=thinking_budget(body),
    )
    media = sum(1 for m in conv.messages for p in m.parts if isinstance(p, ImagePart | VideoPart))
    text = output_format(body)
    control = tool_control(body)
    job = GenerationJob(
        constraint=answer_constraint(conv.tools, control, text),
        constraint_parts=(text,) if text is not None else (),
        constraint_fallback=fallback(control, text, compat.enabled),
        protocol="messages",
        conversation=conv,
        controls=controls(body, ctx, compat),
        params=params,
        max_tokens_given=True,
        stream=stream,
        shape={"messages": count, "tools": len(conv.tools), "media_items": media, "stream": stream},
        compat=compat.adjustments,
    )
    return MessagesRequest(job=job, model=model)


@guarded
def parse_count(body: dict[str, Any], ctx: ApiContext, compat: Compat | None = None) -> GenerationJob:
    compat = compat or Compat(ctx.client_compat)
    _unknown_fields(body, COUNT_KNOWN, compat)
    f.req_str(body, "model")
    conv, _ = conversation(body, ctx, compat)
    options = controls(body, ctx, compat)
    shape = {"tools": len(conv.tools)}
    return GenerationJob("messages", conv, options, SamplingParams(), False, False, shape, compat.adjustments)
