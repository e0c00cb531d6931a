"""The narrow interfaces the generation pipeline needs from the engine, the frontend and the service."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ninfer.api.errors import ApiError
from ninfer.api.events import Event, GenerationJob
from ninfer.engine.api import GenerationRequest, RequestStats, StepOutput
from ninfer.frontend.options import RequestOptions


@dataclass(frozen=True)
class Prepared:
    """A rendered prompt ready for the engine."""

    token_ids: tuple[int, ...]
    thinking: bool  # resolved new-turn thinking mode
    preserve_thinking: bool
    effort: str | None
    turn_checkpoint: int | None = None
    response_checkpoint: int | None = None
    media_items: int = 0


class OutputDecoder(Protocol):
    """Turns committed token ids into reasoning / text / tool-call events."""

    def feed(self, token_ids: Sequence[int]) -> list[Event]: ...

    def finish(self) -> tuple[list[Event], Any]:
        """Flush held text; return the remaining events and the final parse (`reasoning`, `content`,
        `tool_calls` of `ninfer.api.events.ToolCall`, `reasoning_tokens`)."""
        ...


class PromptPort(Protocol):
    """Conversation -> tokens, and tokens -> events, for the loaded artifact."""

    def prepare(self, conversation: Any, controls: RequestOptions, tools_present: bool) -> Prepared:
        """Resolve template options and render; raises ApiError for any request-caused failure."""
        ...

    def decoder(self, prepared: Prepared, tools: list[Any], stop: tuple[str, ...]) -> OutputDecoder:
        """A fresh decoder; stop strings are withheld from the text it emits."""
        ...


class Handle(Protocol):
    stats: RequestStats

    def __iter__(self) -> Iterator[StepOutput]: ...

    def cancel(self) -> None: ...


class Ticket(Protocol):
    def release(self) -> None: ...


class EnginePort(Protocol):
    ready: bool

    def reserve(self) -> Ticket: ...

    def submit(self, ticket: Ticket, request: GenerationRequest) -> Handle: ...


class Observer(Protocol):
    """Receives the lifecycle of measurement requests (request log, tracing)."""

    def rejected(self, request_id: int, job: GenerationJob, error: ApiError, prepare_s: float) -> None: ...

    def started(
        self, request_id: int, job: GenerationJob, prepared: Prepared, request: GenerationRequest
    ) -> None: ...

    def done(
        self, request_id: int, job: GenerationJob, summary: dict[str, Any], stats: RequestStats
    ) -> None: ...

    def failed(
        self, request_id: int, job: GenerationJob, error: ApiError, stats: RequestStats | None
    ) -> None: ...
