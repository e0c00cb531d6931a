"""Responses input Items: validation into normalized wire Items, and Items -> conversation messages.

Normalized Items are plain JSON dicts in the shape `GET /v1/responses/{id}/input_items` returns
(every Item has an id and `status: "completed"`); stored contexts keep them, so a continuation
converts `context + new input` with the same `to_messages`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from ninfer.api import fields as f
from ninfer.api import json_body
from ninfer.api.compat import Compat
from ninfer.api.errors import ApiError, invalid, unknown_parameter
from ninfer.frontend.conversation import CUSTOM_INPUT, ImagePart, Message, Part, TextPart, ToolCall, VideoPart

ID_PREFIX = {
    "message": "msg",
    "reasoning": "rs",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
}
UNSUPPORTED_ITEMS = (
    "item_reference", "file_search_call", "computer_call", "computer_call_output", "web_search_call",
    "image_generation_call", "code_interpreter_call", "local_shell_call", "local_shell_call_output",
    "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output", "mcp_list_tools",
    "mcp_approval_request", "mcp_approval_response", "mcp_call", "compaction", "tool_search_call", "tool_search_output", "additional_tools",
)  # fmt: skip
UNSUPPORTED_PARTS = ("input_file", "input_audio", "refusal")
STATUSES = (None, "in_progress", "completed", "incomplete")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def unsupported_value(param: str, message: str) -> ApiError:
    """A 400 for a recognized field whose value this server does not implement."""
    return ApiError(400, "unsupported_value", message, param)


def _only(
    item: dict[str, Any],
    allowed: Iterable[str],
    param: str,
    null_only: Iterable[str] = (),
    compat: Compat | None = None,
) -> None:
    """Reject unknown keys, and keys that this server accepts only as null (--client-compat: ignored)."""
    known = set(allowed)
    for key, value in item.items():
        if key in null_only:
            if value is not None:
                error = unsupported_value(f"{param}.{key}", f"{param}.{key} is not supported")
                (compat or Compat()).ignore(f"{param}.{key}", error)
        elif key not in known and value is not None:
            raise unknown_parameter(f"{param}.{key}")


def _status(item: dict[str, Any], param: str) -> None:
    if item.get("status") not in STATUSES:
        raise invalid(
            f"{param}.status", "status must be in_progress, completed or incomplete", "invalid_value"
        )


def _media_url(part: dict[str, Any], key: str, param: str) -> str:
    url = f.req_str(part, key, f"{param}.{key}")
    if not url.startswith(("http://", "https://", "data:")):
        raise invalid(f"{param}.{key}", f"{key} must be an http(s) URL or a data URI", "invalid_value")
    return url


def _part(part: dict[str, Any], role: str, param: str, vision: bool, compat: Compat) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "input_text" or kind == "output_text":
        wanted = "output_text" if role == "assistant" else "input_text"
        if kind != wanted:
            raise invalid(f"{param}.type", f"{role} message content must use {wanted} parts", "invalid_value")
        if kind == "output_text":
            _only(part, ("type", "text", "logprobs", "annotations"), param)
            if part.get("annotations"):
                raise unsupported_value(f"{param}.annotations", "output_text annotations are not supported")
            return {
                "type": kind,
                "text": f.req_str(part, "text", f"{param}.text", nonempty=False),
                "annotations": [],
            }
        _only(part, ("type", "text"), param, null_only=("prompt_cache_breakpoint",), compat=compat)
        return {"type": kind, "text": f.req_str(part, "text", f"{param}.text", nonempty=False)}
    if kind in ("input_image", "input_video"):
        if role != "user":
            raise invalid(f"{param}.type", f"{kind} parts are only allowed in user messages", "invalid_value")
        if not vision:
            raise invalid(
                param, "media input requires a server started with vision enabled", "vision_disabled"
            )
        if kind == "input_video":
            _only(part, ("type", "video_url"), param)
            return {"type": kind, "video_url": _media_url(part, "video_url", param)}
        _only(part, ("type", "image_url", "detail"), param, null_only=("file_id", "prompt_cache_breakpoint"))
        if part.get("detail") not in (None, "auto"):
            raise unsupported_value(f"{param}.detail", "only image detail 'auto' is supported")
        return {"type": kind, "image_url": _media_url(part, "image_url", param), "detail": "auto"}
    if kind in UNSUPPORTED_PARTS:
        raise unsupported_value(f"{param}.type", f"{kind} content is not supported by this server")
    raise invalid(f"{param}.type", f"unknown content part type {kind!r}", "invalid_value")


def _message(item: dict[str, Any], param: str, vision: bool, compat: Compat) -> dict[str, Any]:
    _only(item, ("type", "role", "content", "id", "status"), param, null_only=("phase",), compat=compat)
    _status(item, param)
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise invalid(f"{param}.role", "role must be user, assistant, system or developer", "invalid_value")
    content = item.get("content")
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        parts = [{"type": kind, "text": content, **({"annotations": []} if role == "assistant" else {})}]
    elif isinstance(content, list):
        parts = [_part(part, role, p, vision, compat) for p, part in f.objects(content, f"{param}.content")]
    elif content is None:
        raise invalid(f"{param}.content", "message content is required", "missing_required_parameter")
    else:
        raise invalid(f"{param}.content", "content must be a string or an array of parts", "invalid_type")
    return {"type": "message", "role": role, "status": "completed", "content": parts}


def _reasoning(item: dict[str, Any], param: str, compat: Compat) -> dict[str, Any]:
    _only(item, ("type", "id", "summary", "content", "status"), param, ("encrypted_content",), compat=compat)
    _status(item, param)
    if f.opt_list(item, "summary", f"{param}.summary"):
        error = unsupported_value(
            f"{param}.summary", "reasoning summaries are not supported; send raw content"
        )
        compat.ignore(f"{param}.summary", error, "summary dropped; raw reasoning content kept")
    parts = []
    for p, part in f.objects(f.opt_list(item, "content", f"{param}.content") or [], f"{param}.content"):
        if part.get("type") != "reasoning_text":
            raise unsupported_value(f"{p}.type", "reasoning content parts must be reasoning_text")
        _only(part, ("type", "text"), p)
        parts.append({"type": "reasoning_text", "text": f.req_str(part, "text", f"{p}.text", nonempty=False)})
    return {"type": "reasoning", "summary": [], "content": parts, "status": "completed"}


def _function_call(item: dict[str, Any], param: str) -> dict[str, Any]:
    _only(item, ("type", "id", "call_id", "name", "arguments", "status"), param, null_only=("namespace",))
    _status(item, param)
    arguments = f.req_str(item, "arguments", f"{param}.arguments", nonempty=False)
    try:
        decoded = json_body.loads(arguments)
    except ValueError as exc:
        raise invalid(
            f"{param}.arguments",
            f"function_call arguments must be a JSON object string ({exc})",
            "invalid_value",
        ) from None
    if not isinstance(decoded, dict):
        raise invalid(
            f"{param}.arguments", "function_call arguments must be a JSON object string", "invalid_value"
        )
    return {
        "type": "function_call",
        "call_id": f.req_str(item, "call_id", f"{param}.call_id"),
        "name": f.req_str(item, "name", f"{param}.name"),
        "arguments": arguments,
        "status": "completed",
    }


def _custom_call(item: dict[str, Any], param: str) -> dict[str, Any]:
    _only(
        item, ("type", "id", "call_id", "name", "input", "status"), param, null_only=("namespace", "caller")
    )
    _status(item, param)
    return {
        "type": "custom_tool_call",
        "call_id": f.req_str(item, "call_id", f"{param}.call_id"),
        "name": f.req_str(item, "name", f"{param}.name"),
        "input": f.req_str(item, "input", f"{param}.input", nonempty=False),
        "status": "completed",
    }


def _function_output(item: dict[str, Any], param: str) -> dict[str, Any]:
    """A function_call_output or custom_tool_call_output Item (a string output)."""
    kind = item["type"]
    _only(
        item, ("type", "id", "call_id", "output", "status"), param, null_only=("name", "namespace", "caller")
    )
    _status(item, param)
    output = item.get("output")
    if isinstance(output, list):
        raise unsupported_value(f"{param}.output", f"{kind} output must be a string")
    return {
        "type": kind,
        "call_id": f.req_str(item, "call_id", f"{param}.call_id"),
        "output": f.req_str(item, "output", f"{param}.output", nonempty=False),
        "status": "completed",
    }


def normalize_input(
    raw: Any, vision: bool, taken: Iterable[str] = (), compat: Compat | None = None
) -> list[dict[str, Any]]:
    """Validate `input` (a string or a non-empty Item array) into normalized Items with ids.

    `taken` holds ids already present in the continued context; reusing one is a duplicate.
    """
    compat = compat or Compat()
    if isinstance(raw, str):
        return [{"id": new_id("msg"), **_message({"role": "user", "content": raw}, "input", vision, compat)}]
    if not isinstance(raw, list):
        raise invalid("input", "input must be a string or an array of Items", "invalid_type")
    if not raw:
        raise invalid("input", "input must not be empty", "invalid_value")
    seen = set(taken)
    items = []
    for param, item in f.objects(raw, "input"):
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            norm = _message(item, param, vision, compat)
        elif kind == "reasoning":
            norm = _reasoning(item, param, compat)
        elif kind == "function_call":
            norm = _function_call(item, param)
        elif kind == "custom_tool_call":
            norm = _custom_call(item, param)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            norm = _function_output(item, param)
        elif kind in UNSUPPORTED_ITEMS:
            raise unsupported_value(f"{param}.type", f"{kind} Items are not supported by this server")
        else:
            raise invalid(f"{param}.type", f"unknown Item type {kind!r}", "invalid_value")
        item_id = f.opt_str(item, "id", f"{param}.id")
        if item_id is None:
            item_id = new_id(ID_PREFIX[kind])
        elif not item_id:
            raise invalid(f"{param}.id", "Item ids must not be empty", "invalid_value")
        elif item_id in seen:
            raise invalid(f"{param}.id", f"duplicate Item id {item_id!r}", "duplicate_item_id")
        seen.add(item_id)
        items.append({"id": item_id, **norm})
    return items


def item_ids(items: Iterable[dict[str, Any]]) -> list[str]:
    return [item["id"] for item in items]


def _parts(content: Sequence[dict[str, Any]]) -> list[Part]:
    parts: list[Part] = []
    for part in content:
        kind = part["type"]
        if kind in ("input_text", "output_text"):
            parts.append(TextPart(part["text"]))
        elif kind == "input_image":
            parts.append(ImagePart(part["image_url"]))
        elif kind == "input_video":
            parts.append(VideoPart(part["video_url"]))
    return parts


class _Builder:
    """Folds Items into messages: reasoning waits for the next assistant message or call; a
    message and the function / custom tool calls right after it form one assistant turn."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.turn: Message | None = None  # the open assistant turn
        self.reasoning: str | None = None  # reasoning waiting for its assistant turn

    def close(self) -> None:
        self.turn = None
        if self.reasoning is not None:
            self.messages.append(Message(role="assistant", reasoning=self.reasoning))
            self.reasoning = None

    def open_turn(self, parts: list[Part]) -> Message:
        reasoning, self.reasoning = self.reasoning, None
        self.close()
        self.turn = Message(role="assistant", parts=parts, reasoning=reasoning)
        self.messages.append(self.turn)
        return self.turn

    def add(self, item: dict[str, Any]) -> None:
        kind = item["type"]
        if kind == "reasoning":
            self.close()
            self.reasoning = "".join(p["text"] for p in item.get("content") or [])
        elif kind in ("function_call", "custom_tool_call"):
            if kind == "custom_tool_call":
                call = ToolCall(item["call_id"], item["name"], {CUSTOM_INPUT: item["input"]}, custom=True)
            else:
                call = ToolCall(item["call_id"], item["name"], json.loads(item["arguments"]))
            turn = self.turn if self.turn is not None and self.reasoning is None else self.open_turn([])
            turn.tool_calls.append(call)
        elif kind == "message" and item["role"] == "assistant":
            self.open_turn(_parts(item["content"]))
        else:
            self.close()
            if kind in ("function_call_output", "custom_tool_call_output"):
                self.messages.append(
                    Message(role="tool", parts=[TextPart(item["output"])], tool_call_id=item["call_id"])
                )
            else:
                self.messages.append(Message(role=item["role"], parts=_parts(item["content"])))


def to_messages(items: Iterable[dict[str, Any]], instructions: str | None = None) -> list[Message]:
    """Conversation messages for normalized Items; `instructions` becomes a leading developer turn."""
    builder = _Builder()
    if instructions is not None:
        builder.messages.append(Message(role="developer", parts=[TextPart(instructions)]))
    for item in items:
        builder.add(item)
    builder.close()
    return builder.messages


def media_count(items: Iterable[dict[str, Any]]) -> int:
    return sum(
        1
        for item in items
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] in ("input_image", "input_video")
    )
