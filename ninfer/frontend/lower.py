"""Qwen-family lowering: render a `Conversation` with the template, keeping system turns in place.

The official Qwen templates accept one system message, first, and no ``developer`` role. The
serving contract wants every ``system`` and ``developer`` message as a system ChatML block at
its own position. Design:

1. ``developer`` is lowered to ``system``. A leading instruction (message 0) is given to the
   template as its first ``system`` message, so the template's own composition with the tools
   block and the reasoning-effort instruction is kept byte for byte.
2. Every later system message is taken out; the remaining list ("the template list") is
   rendered once, whole, by the template (`full`). That fixes every per-message decision the
   template makes from global context: `last_query_index` (which assistant turns keep their
   reasoning), the tool-response merging and the generation prompt. A system message is not a
   user query, so it never moves `last_query_index`.
3. Each removed system message sits at a cut ``k`` of the template list (before its message
   ``k``). The text the template produces for messages ``[0, k)`` is found by rendering a
   prefix: when the last user query lies inside the prefix, ``items[:k]`` renders exactly as in
   `full` (same `last_query_index`); otherwise a sentinel user message is appended so that every
   prefix assistant turn is, as in `full`, before the last query, and the sentinel's block is cut
   off again. The prefix text must be a prefix of `full` (asserted), and
   ``<|im_start|>system\\n{content}<|im_end|>\\n`` is inserted there.
4. A system message between two tool results splits the merged ``<|im_start|>user`` tool-response
   turn: the turn is closed before the system block and reopened after it.

Wherever the template accepts the input itself (no later system message, no developer role)
the result is exactly the template's output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer.frontend.capabilities import TemplateCapabilities
from ninfer.frontend.conversation import Conversation, ImagePart, Message, VideoPart
from ninfer.frontend.options import PromptOptions
from ninfer.frontend.render import (
    TemplateError,
    message_to_template,
    render_template,
    tool_to_template,
)

IM_END = "<|im_end|>\n"
OPENER = "<|im_start|>assistant\n"
_SENTINEL_TEXT = "ninfer prefix cut"
_SENTINEL_BLOCK = f"<|im_start|>user\n{_SENTINEL_TEXT}{IM_END}"
_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
_VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"


@dataclass(frozen=True)
class RenderedChat:
    """A rendered prompt and the character offsets the checkpoints are derived from."""

    text: str
    # just after "<|im_start|>assistant\n" of the first assistant turn after the last user query
    # (the generation prompt's own opener when the open turn has no assistant message yet)
    open_turn_opener_end: int | None
    # where the generation prompt begins (None without a generation prompt)
    prologue_start: int | None


def template_kwargs(caps: TemplateCapabilities, options: PromptOptions) -> dict[str, Any]:
    """The keyword arguments passed to the template for resolved options."""
    kwargs: dict[str, Any] = {}
    if caps.thinking_switch:
        kwargs["enable_thinking"] = options.thinking
    if caps.preserve_thinking:
        kwargs["preserve_thinking"] = options.preserve_thinking
    if caps.efforts and options.effort is not None:
        kwargs["reasoning_effort"] = options.effort
    return kwargs


def _system_block(message: Message) -> str:
    for part in message.parts:
        if isinstance(part, ImagePart):
            raise TemplateError("System message cannot contain images.")
        if isinstance(part, VideoPart):
            raise TemplateError("System message cannot contain videos.")
    return f"<|im_start|>system\n{message.text.strip()}{IM_END}"


def _is_query(item: dict[str, Any]) -> bool:
    """The template's test for a real user query (not a wrapped tool response)."""
    content = item["content"]
    if not isinstance(content, str):
        pieces = []
        for part in content:
            pieces.append(
                _IMAGE if part["type"] == "image" else _VIDEO if part["type"] == "video" else part["text"]
            )
        content = "".join(pieces)
    content = content.strip()
    return not (content.startswith("<tool_response>") and content.endswith("</tool_response>"))


def _last_query(items: list[dict[str, Any]]) -> int | None:
    for i in range(len(items) - 1, -1, -1):
        if items[i]["role"] == "user" and _is_query(items[i]):
            return i
    return None


class _Renderer:
    """Renders prefixes of one template list with fixed tools and keyword arguments."""

    def __init__(self, template: str, items: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any]):
        self.template = template
        self.items = items
        self.tools = tools
        self.kwargs = kwargs
        self.last_query = _last_query(items)

    def render(self, items: list[dict[str, Any]], gen: bool) -> str:
        return render_template(self.template, items, self.tools, add_generation_prompt=gen, **self.kwargs)

    def prefix(self, k: int) -> str:
        """The template's text for messages [0, k) as they render inside the whole list."""
        if self.last_query is not None and self.last_query < k:
            return self.render(self.items[:k], gen=False)
        sentinel = {"role": "user", "content": _SENTINEL_TEXT}
        text = self.render([*self.items[:k], sentinel], gen=False)
        if not text.endswith(_SENTINEL_BLOCK):
            raise AssertionError("template did not render the sentinel query last")
        return text[: -len(_SENTINEL_BLOCK)]


def render_chat(
    conv: Conversation,
    template: str,
    caps: TemplateCapabilities,
    options: PromptOptions,
    add_generation_prompt: bool = True,
) -> RenderedChat:
    """Render `conv` with the template, lowering system/developer messages (ChatML templates)."""
    tools = [tool_to_template(t) for t in conv.tools] or None
    kwargs = template_kwargs(caps, options)
    items: list[dict[str, Any]] = []
    inserts: dict[int, list[str]] = {}
    for i, message in enumerate(conv.messages):
        if not caps.chatml:
            items.append(message_to_template(message))
            continue
        role = "system" if message.role in ("system", "developer") else message.role
        if role == "system" and i > 0:
            inserts.setdefault(len(items), []).append(_system_block(message))
        else:
            items.append(message_to_template(message, role))

    r = _Renderer(template, items, tools, kwargs)
    full = r.render(items, gen=add_generation_prompt)
    if not caps.chatml:
        return RenderedChat(full, None, None)

    # (offset in `full`, text to insert there), in order
    splices: list[tuple[int, str]] = []
    for k in sorted(inserts):
        prefix = r.prefix(k)
        blocks = "".join(inserts[k])
        split_tools = 0 < k < len(items) and items[k - 1]["role"] == "tool" and items[k]["role"] == "tool"
        if split_tools:
            if not prefix.endswith(IM_END):
                raise AssertionError("tool-response turn did not close at the cut")
            prefix = prefix[: -len(IM_END)]
            blocks = IM_END + blocks + "<|im_start|>user"
        if not full.startswith(prefix):
            raise AssertionError(f"prefix rendering diverges from the whole rendering at message {k}")
        splices.append((len(prefix), blocks))

    def shifted(offset: int) -> int:
        return offset + sum(len(b) for at, b in splices if at <= offset)

    text = full
    for at, blocks in reversed(splices):
        text = text[:at] + blocks + text[at:]

    prologue = full.rindex(OPENER) if add_generation_prompt else None
    opener_end: int | None = None
    start = r.last_query + 1 if r.last_query is not None else len(items)
    first_assistant = next((j for j in range(start, len(items)) if items[j]["role"] == "assistant"), None)
    if first_assistant is not None:
        at = len(r.prefix(first_assistant))
        if not full.startswith(OPENER, at):
            raise AssertionError("open-turn assistant message does not start with the ChatML opener")
        opener_end = shifted(at) + len(OPENER)
    elif prologue is not None:
        opener_end = shifted(prologue) + len(OPENER)
    return RenderedChat(text, opener_end, None if prologue is None else shifted(prologue))
