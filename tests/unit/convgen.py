"""Deterministic random conversations for the frontend tests (internal form + OpenAI-style dicts)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ninfer.frontend.conversation import (
    Conversation,
    ImagePart,
    Message,
    TextPart,
    Tool,
    ToolCall,
    VideoPart,
)

WORDS = [
    "hello", "world", "Paris", "naïve", "日本語", "Ελληνικά", "emoji 🎉", "tab\there", "a\nb",
    "  padded  ", "<b>", "x", "?", "42", "3.5", "true", "null", "{\"k\": 1}", "“quotes”", "\\",
    "</think>", "<think>", "`code`", "ß", "é", "",
]  # fmt: skip

TOOL_POOL = [
    Tool("get_weather", "Get current weather", {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    }),
    Tool("set_flags", "Set flags — ünïcode description", {
        "type": "object",
        "properties": {
            "enabled": {"type": "boolean"}, "ratio": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "opts": {"type": "object"}, "note": {"type": ["string", "null"]},
        },
    }),
    Tool("search", None, {"type": "object", "properties": {"q": {"type": "string"}}}),
    Tool("no_params", "Takes nothing", None),
]  # fmt: skip


def _text(rng: random.Random, n_max: int = 6) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, n_max)))


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 2 else 6)
    if kind == 0:
        return _text(rng, 3)
    if kind == 1:
        return rng.randint(-1000, 1000)
    if kind == 2:
        return rng.choice([0.5, -2.25, 1e-3, 3.0])
    if kind == 3:
        return rng.random() < 0.5
    if kind == 4:
        return None
    if kind == 5:
        return rng.choice(["Paris", "日本", "ok", ""])
    if kind == 6:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def _user_parts(rng: random.Random) -> list[Any]:
    parts: list[Any] = []
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        if r < 0.15:
            parts.append(ImagePart(f"https://example.com/{rng.randint(0, 99)}.png"))
        elif r < 0.22:
            parts.append(VideoPart(f"data:video/mp4;base64,AAAA{rng.randint(0, 9)}"))
        else:
            parts.append(TextPart(_text(rng) or "q"))
    return parts


def _reasoning(rng: random.Random) -> str | None:
    r = rng.random()
    if r < 0.3:
        return None
    if r < 0.4:
        return ""
    return rng.choice(["", "\n", "  "]) + _text(rng, 8) + rng.choice(["", "\n", " \n"])


def _assistant(rng: random.Random, tools: list[Tool], calls: bool) -> Message:
    content = _text(rng, 5) if rng.random() < 0.7 else ""
    reasoning = _reasoning(rng)
    if reasoning is None and rng.random() < 0.15:
        content = f"<think>\n{_text(rng, 3)}\n</think>\n\n{content}"  # inline think (3.5/3.6 split it)
    tool_calls = []
    if calls:
        for _ in range(rng.randint(1, 3)):
            tool = rng.choice(tools)
            names = list((tool.parameters or {}).get("properties", {})) or ["arg"]
            args = {n: _value(rng) for n in rng.sample(names, rng.randint(0, len(names)))}
            tool_calls.append(ToolCall(f"call_{rng.randrange(1 << 30):x}", tool.name, args))
    return Message("assistant", [TextPart(content)] if content else [], reasoning, tool_calls)


@dataclass
class Case:
    conv: Conversation
    thinking: bool
    preserve: bool
    effort: str | None


def generate(seed: int, template: str) -> Case:
    """One conversation the official template accepts (optionally a leading developer message)."""
    rng = random.Random(seed)
    tools = rng.sample(TOOL_POOL, rng.randint(0, 3)) if rng.random() < 0.6 else []
    messages: list[Message] = []
    if rng.random() < 0.5:
        role = "system" if rng.random() < 0.7 else "developer"
        messages.append(Message(role, [TextPart(rng.choice(["", " ", _text(rng, 8)]))]))
    for turn in range(rng.randint(1, 4)):
        messages.append(Message("user", _user_parts(rng)))
        last = turn == 0 or rng.random() < 0.4
        for _ in range(rng.randint(0, 2) if tools else 0):
            call = _assistant(rng, tools, calls=True)
            messages.append(call)
            for tc in call.tool_calls:
                messages.append(Message("tool", [TextPart(_text(rng, 4))], tool_call_id=tc.id, name=tc.name))
        if rng.random() < 0.75 or not last:
            messages.append(_assistant(rng, tools, calls=False))
    thinking = rng.random() < 0.7
    effort = None
    if template == "qwen3_8" and thinking:
        effort = rng.choice(["low", "medium", "xhigh"])
    return Case(Conversation(messages, tools), thinking, rng.random() < 0.5, effort)


def to_openai(message: Message) -> dict[str, Any]:
    """An OpenAI Chat Completions style dict, as a transformers user would pass it."""
    role = "system" if message.role == "developer" else message.role
    if any(not isinstance(p, TextPart) for p in message.parts):
        content: Any = []
        for p in message.parts:
            if isinstance(p, TextPart):
                content.append({"type": "text", "text": p.text})
            elif isinstance(p, ImagePart):
                content.append({"type": "image_url", "image_url": {"url": p.url}})
            else:
                content.append({"type": "video_url", "video_url": {"url": p.url}, "video": p.url})
    else:
        content = "".join(p.text for p in message.parts)
    out: dict[str, Any] = {"role": role, "content": content}
    if message.reasoning is not None:
        out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def tools_openai(conv: Conversation) -> list[dict[str, Any]] | None:
    out = []
    for t in conv.tools:
        fn: dict[str, Any] = {"name": t.name}
        if t.description is not None:
            fn["description"] = t.description
        if t.parameters is not None:
            fn["parameters"] = t.parameters
        out.append({"type": "function", "function": fn})
    return out or None
