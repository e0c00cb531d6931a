"""Streaming decoder of generated output: reasoning channel, answer text and XML tool calls.

Conventions (they mirror the template's history form ``<think>\\n{reasoning}\\n</think>\\n\\n{content}``):

* With thinking on, the prompt already ends in ``<think>\\n``, so output starts in the
  reasoning channel and stays there until ``</think>``. One ``\\n`` directly before ``</think>``
  and up to two ``\\n`` directly after it are markup and dropped. Output that never closes the
  think block is all reasoning. A ``<tool_call>`` inside reasoning is reasoning text (it is
  not executed and not lost); so is a ``<think>`` the model writes itself.
* With thinking off, output is content from the first byte.
* With tools, ``<tool_call>...</tool_call>`` blocks in content become structured calls; the
  whole block is held until its closing tag, then `ToolCallStart`, one
  `ToolCallArgumentsDelta` (the complete JSON object; a custom tool's call: its raw input) and
  `ToolCallEnd` are emitted together.
  Whitespace between text and a call, between calls and after the last call is separator markup
  and dropped. Ordinary text streams at once; only a trailing whitespace run and a suffix that
  could still grow into ``<tool_call>`` are held back. A malformed or unterminated block is
  flushed back as text with every byte (its leading whitespace included). Without tools, all
  content is text.
* Token accounting: `feed_ids` counts every id accepted while the parser is in the reasoning
  channel (the ``</think>`` id included) as a reasoning token; text is never re-tokenized.
  Callers feed only ids whose text is shown (a withheld stop token is not fed).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ninfer.frontend.conversation import Tool, ToolCall
from ninfer.frontend.toolcall import parse_block, typed_arguments

THINK_END = "</think>"
CALL_START = "<tool_call>"
CALL_END = "</tool_call>"


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class TextDelta:
    text: str
    # Where `text` begins in everything fed to the parser, in characters (answer text is always one
    # contiguous run of the output; the markup around it is what is dropped). A consumer maps it
    # back to the tokens that produced the text (Responses output_text logprobs).
    start: int = field(default=0, compare=False)


@dataclass(frozen=True)
class ToolCallStart:
    index: int  # order of the call within this response, from 0
    id: str
    name: str
    custom: bool = False  # a custom tool's call: the deltas carry its free-form input


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    index: int
    json_fragment: str  # the arguments' JSON text; a custom call's input text


@dataclass(frozen=True)
class ToolCallEnd:
    index: int
    call: ToolCall


Event = ReasoningDelta | TextDelta | ToolCallStart | ToolCallArgumentsDelta | ToolCallEnd


@dataclass
class ParseResult:
    """The whole output: equal to the concatenation of the streamed events."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning_tokens: int = 0


class Detokenizer(Protocol):
    """`ninfer.text.detok.IncrementalDetokenizer`: text of newly pushed ids (special tokens as text)."""

    def push(self, ids: Iterable[int]) -> str: ...

    def flush(self) -> str: ...


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def arguments_json(arguments: dict[str, Any]) -> str:
    """The one JSON text of a call's arguments: what `ToolCallArgumentsDelta`s stream, in full."""
    return json.dumps(arguments, ensure_ascii=False)


def call_payload(call: ToolCall) -> str:
    """What a call's `ToolCallArgumentsDelta`s stream, in full: a custom call's input, or the
    arguments' JSON."""
    return call.input if call.custom else arguments_json(call.arguments)


def _partial_suffix(text: str, *tags: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


def _trailing_space(text: str) -> int:
    return len(text) - len(text.rstrip())


class OutputParser:
    """Incremental parser of one response; feed ids (`feed_ids`) or text (`feed_text`), then `finish`."""

    def __init__(
        self,
        *,
        thinking: bool,
        tools: list[Tool] | None = None,
        detokenizer: Detokenizer | None = None,
        call_id: Callable[[], str] = new_call_id,
    ) -> None:
        self._tools = {t.name: t for t in tools or []}
        self._parse_tools = bool(tools)
        self._detok = detokenizer
        self._call_id = call_id
        self._state = "reasoning" if thinking else "text"
        self._buf = ""
        self._sep = ""  # whitespace dropped before the current tool block (restored if malformed)
        self._newlines = 0  # newlines dropped after </think>
        self._finished = False
        self._fed = 0  # characters fed so far; `_buf` is always their suffix
        self.result = ParseResult()

    @property
    def in_reasoning(self) -> bool:
        return self._state == "reasoning"

    def feed_ids(self, ids: Iterable[int]) -> list[Event]:
        """Accept generated token ids (needs a detokenizer); reasoning tokens are counted here."""
        if self._detok is None:
            raise RuntimeError("feed_ids needs a detokenizer")
        events: list[Event] = []
        for token in ids:
            reasoning = self.in_reasoning
            events += self.feed_text(self._detok.push([token]))
            if reasoning:
                self.result.reasoning_tokens += 1
        return events

    def feed_text(self, delta: str) -> list[Event]:
        """Accept a text delta and return the events it completes."""
        if self._finished:
            raise RuntimeError("parser already finished")
        self._buf += delta
        self._fed += len(delta)
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def finish(self) -> list[Event]:
        """End of output: flush whatever is held, by the rules in the module doc."""
        events: list[Event] = []
        if self._detok is not None:
            events += self.feed_text(self._detok.flush())
        buf, self._buf = self._buf, ""
        at = self._fed - len(buf)
        if self._state == "reasoning":
            self._reasoning(events, buf)
        elif self._state == "text":
            self._text(events, buf, at)
        elif self._state == "tool":
            self._text(events, self._sep + CALL_START + buf, self._block_start(at))
        elif self._state == "after_call" and buf.strip():
            self._text(events, buf, at)
        self._finished = True
        return events

    # -- emission ---------------------------------------------------------------------------

    def _reasoning(self, events: list[Event], text: str) -> None:
        if text:
            events.append(ReasoningDelta(text))
            self.result.reasoning += text

    def _text(self, events: list[Event], text: str, start: int) -> None:
        if text:
            events.append(TextDelta(text, start))
            self.result.content += text

    def _block_start(self, at: int) -> int:
        """Where the open tool block's separator begins, given where its body (`_buf`) begins."""
        return at - len(CALL_START) - len(self._sep)

    def _call(self, events: list[Event], name: str, params: list[tuple[str, str]]) -> None:
        index = len(self.result.tool_calls)
        tool = self._tools.get(name)
        custom = tool is not None and tool.custom
        call = ToolCall(self._call_id(), name, typed_arguments(tool, params), custom=custom)
        events.append(ToolCallStart(index, call.id, name, custom))
        events.append(ToolCallArgumentsDelta(index, call_payload(call)))
        events.append(ToolCallEnd(index, call))
        self.result.tool_calls.append(call)

    # -- state machine: each step consumes from the buffer; False when it must wait -----------

    def _step(self, events: list[Event]) -> bool:
        buf = self._buf
        at = self._fed - len(buf)  # where `buf` begins in the output
        state = self._state
        if state == "reasoning":
            end = buf.find(THINK_END)
            if end >= 0:
                text = buf[:end]
                self._reasoning(events, text[:-1] if text.endswith("\n") else text)
                self._buf = buf[end + len(THINK_END) :]
                self._state = "after_think"
                return True
            hold = _partial_suffix(buf, "\n" + THINK_END, THINK_END)
            self._reasoning(events, buf[: len(buf) - hold])
            self._buf = buf[len(buf) - hold :]
            return False
        if state == "after_think":
            while self._newlines < 2 and self._buf.startswith("\n"):
                self._buf = self._buf[1:]
                self._newlines += 1
            if self._newlines < 2 and not self._buf:
                return False
            self._state = "text"
            return True
        if state == "text":
            if not self._parse_tools:
                self._text(events, buf, at)
                self._buf = ""
                return False
            start = buf.find(CALL_START)
            if start >= 0:
                before = buf[:start]
                space = _trailing_space(before)
                self._text(events, before[: len(before) - space], at)
                self._sep = before[len(before) - space :]
                self._buf = buf[start + len(CALL_START) :]
                self._state = "tool"
                return True
            hold = _partial_suffix(buf, CALL_START)
            hold += _trailing_space(buf[: len(buf) - hold])
            self._text(events, buf[: len(buf) - hold], at)
            self._buf = buf[len(buf) - hold :]
            return False
        if state == "tool":
            block = self._block_start(at)  # the held separator and <tool_call> precede `buf`
            end = buf.find(CALL_END)
            nested = buf.find(CALL_START)
            if end >= 0 and (nested < 0 or end < nested):
                parsed = parse_block(buf[:end])
                if parsed is None:
                    self._text(events, self._sep + CALL_START + buf[: end + len(CALL_END)], block)
                    self._state = "text"
                else:
                    self._call(events, *parsed)
                    self._state = "after_call"
                self._sep = ""
                self._buf = buf[end + len(CALL_END) :]
                return True
            if nested >= 0:  # a new block opens before this one closed: this one is text
                malformed = self._sep + CALL_START + buf[:nested]
                space = _trailing_space(malformed)
                self._text(events, malformed[: len(malformed) - space], block)
                self._sep = malformed[len(malformed) - space :]
                self._buf = buf[nested + len(CALL_START) :]
                return True
            return False
        # after_call: whitespace is a separator; a new block, or text (with its whitespace)
        rest = buf.lstrip()
        if rest.startswith(CALL_START):
            self._sep = buf[: len(buf) - len(rest)]
            self._buf = rest[len(CALL_START) :]
            self._state = "tool"
            return True
        if not rest or CALL_START.startswith(rest):
            return False
        self._state = "text"
        return True


def parse_text(text: str, *, thinking: bool, tools: list[Tool] | None = None) -> ParseResult:
    """Parse a complete output in one go (same rules as streaming)."""
    parser = OutputParser(thinking=thinking, tools=tools)
    parser.feed_text(text)
    parser.finish()
    return parser.result
