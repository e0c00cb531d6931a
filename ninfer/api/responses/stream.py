"""The Responses semantic-event sequencer: parsed generation events -> typed SSE event objects.

Pure: it is fed the pipeline's events and returns wire dicts; the route frames them. The same
sequencer builds the non-streaming body, so a stream's deltas always concatenate to the final
Items.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ninfer.api import sse
from ninfer.api.events import (
    Event,
    Finished,
    LogprobsDelta,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    call_payload,
)
from ninfer.api.responses.items import ID_PREFIX, new_id
from ninfer.api.responses.logprobs import TextLogprobs, event_entries
from ninfer.api.responses.object import Envelope, failure

CALL_ITEMS = ("function_call", "custom_tool_call")  # Items without content parts


def frame(event: dict[str, Any]) -> bytes:
    """One SSE frame whose event name equals the JSON `type`."""
    return sse.frame(event, event["type"])


class _Open:
    """The output Item being streamed: its wire dict, the text gathered so far and (a message)
    the logprob entries of that text's tokens."""

    def __init__(self, index: int, item: dict[str, Any]) -> None:
        self.index = index
        self.item = item
        self.chunks: list[str] = []
        self.logprobs: list[dict[str, Any]] = []

    @property
    def id(self) -> str:
        return self.item["id"]

    @property
    def text(self) -> str:
        return "".join(self.chunks)


class ResponseSequencer:
    """Emits response.created / in_progress, per-Item added / delta / done events and one terminal.

    Output Items are opened lazily: reasoning text opens a reasoning Item, answer text a message
    Item, a tool call a function_call (a custom tool's: custom_tool_call) Item; a change of kind closes the open Item. With logprobs
    requested (`LogprobsDelta` events), each answer delta carries its tokens' logprobs and the
    message's output_text part all of them; without, those lists are empty (as OpenAI's are).
    """

    def __init__(self, envelope: Envelope, make_id: Callable[[str], str] = new_id) -> None:
        self.envelope = envelope
        self.make_id = make_id
        self.output: list[dict[str, Any]] = []
        self.response: dict[str, Any] | None = None  # the terminal object
        self._seq = 0
        self._open: _Open | None = None
        self._calls: dict[int, _Open] = {}
        self._logprobs = TextLogprobs()

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _part(self, open_: _Open, text: str) -> dict[str, Any]:
        if open_.item["type"] == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": list(open_.logprobs)}

    def start(self) -> list[dict[str, Any]]:
        body = self.envelope.body("in_progress")
        return [
            self._event("response.created", response=body),
            self._event("response.in_progress", response=body),
        ]

    def _begin(self, item: dict[str, Any]) -> tuple[_Open, list[dict[str, Any]]]:
        open_ = _Open(len(self.output), item)
        self.output.append(item)
        events = [self._event("response.output_item.added", output_index=open_.index, item=dict(item))]
        if item["type"] not in CALL_ITEMS:
            item["content"] = []
            events[0]["item"]["content"] = []
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=open_.id,
                    output_index=open_.index,
                    content_index=0,
                    part=self._part(open_, ""),
                )
            )
        return open_, events

    def _text(self, kind: str, delta: str, start: int = 0) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is None or self._open.item["type"] != kind:
            events += self._close("completed")
            if kind == "reasoning":
                item = {"id": self.make_id("rs"), "type": "reasoning", "summary": [], "status": "in_progress"}
            else:
                item = {
                    "id": self.make_id("msg"),
                    "type": "message",
                    "role": "assistant",
                    "status": "in_progress",
                }
            self._open, started = self._begin(item)
            events += started
        self._open.chunks.append(delta)
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra: dict[str, Any] = {}
        if kind != "reasoning":
            entries = self._logprobs.take(start, delta)
            self._open.logprobs += entries
            extra["logprobs"] = event_entries(entries)
        events.append(
            self._event(
                name,
                item_id=self._open.id,
                output_index=self._open.index,
                content_index=0,
                delta=delta,
                **extra,
            )
        )
        return events

    def _close(self, status: str) -> list[dict[str, Any]]:
        open_, self._open = self._open, None
        if open_ is None:
            return []
        item, text = open_.item, open_.text
        loc = {"item_id": open_.id, "output_index": open_.index}
        if item["type"] == "function_call":
            item.update(arguments=text, status=status)
            done = self._event(
                "response.function_call_arguments.done", **loc, arguments=text, name=item["name"]
            )
            return [done, self._event("response.output_item.done", output_index=open_.index, item=dict(item))]
        if item["type"] == "custom_tool_call":
            item.update(input=text, status=status)
            done = self._event("response.custom_tool_call_input.done", **loc, input=text)
            return [done, self._event("response.output_item.done", output_index=open_.index, item=dict(item))]
        part = self._part(open_, text)
        item.update(content=[part], status=status)
        if item["type"] == "reasoning":
            text_done = self._event("response.reasoning_text.done", **loc, content_index=0, text=text)
        else:
            text_done = self._event(
                "response.output_text.done",
                **loc,
                content_index=0,
                text=text,
                logprobs=event_entries(open_.logprobs),
            )
        return [
            text_done,
            self._event("response.content_part.done", **loc, content_index=0, part=dict(part)),
            self._event("response.output_item.done", output_index=open_.index, item=_copy(item)),
        ]

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """Events for one parsed generation event; `Finished` produces the terminal event."""
        if isinstance(event, ReasoningDelta):
            return self._text("reasoning", event.text) if event.text else []
        if isinstance(event, TextDelta):
            return self._text("message", event.text, event.start) if event.text else []
        if isinstance(event, LogprobsDelta):
            self._logprobs.add(event.entries)
            return []
        if isinstance(event, ToolCallStart):
            events = self._close("completed")
            kind, payload = ("custom_tool_call", "input") if event.custom else ("function_call", "arguments")
            item = {
                "id": self.make_id(ID_PREFIX[kind]),
                "type": kind,
                "status": "in_progress",
                "call_id": event.id,
                "name": event.name,
                payload: "",
            }
            self._open, started = self._begin(item)
            self._calls[event.index] = self._open
            return events + started
        if isinstance(event, ToolCallArgumentsDelta):
            open_ = self._calls[event.index]
            if open_ is not self._open:
                raise ValueError(f"arguments for tool call {event.index} arrived after it was closed")
            open_.chunks.append(event.json_fragment)
            custom = open_.item["type"] == "custom_tool_call"
            return [
                self._event(
                    "response.custom_tool_call_input.delta"
                    if custom
                    else "response.function_call_arguments.delta",
                    item_id=open_.id,
                    output_index=open_.index,
                    delta=event.json_fragment,
                )
            ]
        if isinstance(event, ToolCallEnd):
            open_ = self._calls[event.index]
            if open_ is not self._open or open_.text != call_payload(event.call):
                raise ValueError(f"tool call {event.index} ended with arguments that were not streamed")
            return self._close("completed")
        if isinstance(event, Finished):
            return self.finish(event)
        raise TypeError(f"unexpected generation event {event!r}")

    def finish(self, done: Finished) -> list[dict[str, Any]]:
        """Close the open Item and end with response.completed or response.incomplete."""
        return [*self.settle(done), self.terminal()]

    def settle(self, done: Finished) -> list[dict[str, Any]]:
        """Close the open Item and fix the terminal object (`response`) without emitting it yet,
        so the caller can still turn the ending into a failure (e.g. the store refused it)."""
        incomplete = done.finish == "length"
        events = self._close("incomplete" if incomplete else "completed")
        status = "incomplete" if incomplete else "completed"
        self.response = self.envelope.body(
            status, self.output, done.usage, incomplete_reason="max_output_tokens" if incomplete else None
        )
        return events

    def terminal(self) -> dict[str, Any]:
        """The one terminal event for the settled `response`."""
        if self.response is None:
            raise RuntimeError("terminal() before settle()")
        return self._event(f"response.{self.response['status']}", response=self.response)

    def fail(self, message: str) -> list[dict[str, Any]]:
        """Close the open Item as incomplete and end with response.failed."""
        events = self._close("incomplete")
        self.response = self.envelope.body("failed", self.output, error=failure(message))
        return [*events, self._event("response.failed", response=self.response)]


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(p) for p in out["content"]]
    return out
