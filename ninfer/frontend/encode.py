"""Prompt encoding: render, tokenize, and place the engine's checkpoint boundaries.

Checkpoints (token counts into `token_ids`, see the serving contract's execution behaviour):

* ``preserve_thinking`` on: closed turns keep their reasoning, so the next request re-renders
  this prompt unchanged and diverges, at the earliest, inside the response. The response
  checkpoint is the prompt frontier after the generation prologue (``<think>\\n`` or the empty
  think block), i.e. the whole prompt. `turn_checkpoint` is None.
* ``preserve_thinking`` off: once the next user query arrives, every assistant turn of the
  current open turn (the turns after the last user query, and the response being generated)
  is re-rendered without its think block. Their ``<|im_start|>assistant\\n`` opener survives,
  so the turn checkpoint sits just after the first assistant opener of the open turn.
  `response_checkpoint` is None.

Both boundaries fall just before a ``<think>`` special token, so tokenizing the prefix alone
gives exactly the leading ids of the whole prompt; this is checked on every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ninfer.frontend.capabilities import TemplateCapabilities, resolve_capabilities
from ninfer.frontend.conversation import Conversation, ImagePart, VideoPart
from ninfer.frontend.lower import render_chat
from ninfer.frontend.options import PromptOptions


class TextEncoder(Protocol):
    """What prompt encoding needs of a tokenizer (`ninfer.text.tokenizer.Tokenizer`)."""

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class EncodedPrompt:
    """A rendered, tokenized prompt with its checkpoint boundaries and media in prompt order.

    `token_ids` hold one ``<|image_pad|>`` / ``<|video_pad|>`` per media item; ninfer.media
    expands each to its grid size, item by item in the order of `media`.
    """

    text: str
    token_ids: list[int]
    turn_checkpoint: int | None
    response_checkpoint: int | None
    media: list[ImagePart | VideoPart] = field(default_factory=list)
    options: PromptOptions | None = None


def _count_at(tokenizer: TextEncoder, text: str, ids: list[int], offset: int) -> int:
    head = tokenizer.encode(text[:offset])
    if ids[: len(head)] != head:
        raise AssertionError(f"checkpoint boundary at character {offset} splits a token")
    return len(head)


def encode_prompt(
    conv: Conversation,
    options: PromptOptions,
    template: str,
    tokenizer: TextEncoder,
    caps: TemplateCapabilities | None = None,
    add_generation_prompt: bool = True,
) -> EncodedPrompt:
    """Render `conv` with the artifact's `template` and tokenize it with checkpoint boundaries.

    Raises `ninfer.frontend.render.TemplateError` when the template refuses the conversation.
    """
    caps = caps or resolve_capabilities(template)
    rendered = render_chat(conv, template, caps, options, add_generation_prompt)
    ids = tokenizer.encode(rendered.text)
    turn: int | None = None
    response: int | None = None
    if add_generation_prompt and rendered.prologue_start is not None:
        if options.preserve_thinking:
            response = len(ids)
        elif rendered.open_turn_opener_end is not None:
            turn = _count_at(tokenizer, rendered.text, ids, rendered.open_turn_opener_end)
    media = [p for m in conv.messages for p in m.parts if isinstance(p, (ImagePart, VideoPart))]
    return EncodedPrompt(rendered.text, ids, turn, response, media, options)


def count_tokens(
    conv: Conversation,
    options: PromptOptions,
    template: str,
    tokenizer: TextEncoder,
    caps: TemplateCapabilities | None = None,
) -> int:
    """Prompt tokens before media expansion, by exactly the path generation uses."""
    return len(encode_prompt(conv, options, template, tokenizer, caps).token_ids)
