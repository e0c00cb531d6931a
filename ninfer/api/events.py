"""Protocol-independent generation events and the data a protocol adapter hands the pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ninfer.engine.types import ConstraintSpec, SamplingParams
from ninfer.frontend import parser
from ninfer.frontend.conversation import Conversation, ToolCall
from ninfer.frontend.options import RequestOptions
from ninfer.frontend.parser import (
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    arguments_json,
    call_payload,
)

# The streamed events are the output parser's own; this module adds the protocol-level ones.
__all__ = [
    "Event",
    "FinishKind",
    "Finished",
    "GenerationJob",
    "LogprobsDelta",
    "Protocol",
    "ReasoningDelta",
    "TextDelta",
    "ToolCall",
    "ToolCallArgumentsDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "Usage",
    "arguments_json",
    "call_payload",
]

Protocol = Literal["chat_completions", "messages", "responses", "completions"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


# "stop": model end-of-turn or a stop string; "length": output or context budget exhausted;
# "tool_calls": the answer ended with at least one parsed tool call.
FinishKind = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True)
class Finished:
    """The last event: why generation ended, the complete parse and the usage."""

    finish: FinishKind
    usage: Usage
    reasoning: str
    content: str
    tool_calls: tuple[ToolCall, ...]  # arguments decoded; `arguments_json` gives the streamed text
    stop_string: str | None = None
    # with logprobs requested: one entry per generated token (a stop token excluded), in order
    logprobs: tuple[dict[str, Any], ...] | None = None
    # with logprobs requested, a stop token ended the answer: its entry (not among `logprobs`)
    stop_logprob: dict[str, Any] | None = None
    # with prompt logprobs requested: one entry per prompt token (the same shape), None for the first
    prompt_logprobs: tuple[dict[str, Any] | None, ...] | None = None


@dataclass(frozen=True)
class LogprobsDelta:
    """The logprobs of one engine step's tokens, in OpenAI's entry shape: {token, logprob, bytes,
    top_logprobs: [{token, logprob, bytes}]} (emitted before that step's text events)."""

    entries: tuple[dict[str, Any], ...]


Event = parser.Event | Finished | LogprobsDelta


@dataclass
class GenerationJob:
    """What a protocol adapter hands the pipeline after validating its own request schema."""

    protocol: Protocol
    conversation: Conversation
    controls: RequestOptions  # thinking / effort / preserve fields exactly as the request spelled them
    params: SamplingParams
    max_tokens_given: bool
    stream: bool
    # Request shape recorded by the log (counts and flags only, never text).
    shape: dict[str, Any] = field(default_factory=dict)
    # --client-compat: fields accepted, ignored or mapped, and tools left out (see api/compat.py)
    compat: list[dict[str, str]] = field(default_factory=list)
    # legacy completions: the prompt's token ids as given (no chat template; thinking off)
    raw_prompt: tuple[int, ...] | None = None
    constraint: ConstraintSpec | None = None  # a grammar for the answer (response_format, tools)
    # formats folded into `constraint`, compiled first so a refused schema names its own field
    constraint_parts: tuple[ConstraintSpec, ...] = ()
    # --client-compat: an engine that cannot constrain drops `constraint`, recording this detail
    constraint_fallback: str | None = None
    client_request_id: str | None = None  # the caller's `x-request-id` (logged with the request)
