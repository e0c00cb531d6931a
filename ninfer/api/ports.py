"""The narrow interfaces the generation pipeline needs from the engine, the frontend and the service."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ninfer.api.errors import ApiError
from ninfer.api.events import GenerationJob
from ninfer.engine.multimodal import MultimodalPrompt
from ninfer.engine.tickets import Ticket  # a lifetime reservation (its deadline bounds media prep)
from ninfer.engine.types import ConstraintSpec, GenerationRequest, RequestStats, StepOutput
from ninfer.frontend.capabilities import TemplateCapabilities
from ninfer.frontend.conversation import Conversation, Tool
from ninfer.frontend.options import RequestOptions
from ninfer.frontend.parser import Event, ParseResult  # the decoder's text events
from ninfer.text.tokenizer import Tokenizer


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
    # expanded media (vision on): the engine's input, owning the payload references until closed
    multimodal: MultimodalPrompt | None = None
    media_log: dict[str, Any] | None = None  # request-log acquisition / preprocessing / cache fields

    def release_media(self) -> None:
        """Let go of the payloads when the engine never takes them (a failed submit, a count)."""
        if self.multimodal is not None:
            self.multimodal.close()


class OutputDecoder(Protocol):
    """Turns the engine's visible text into reasoning / text / tool-call events."""

    def feed(self, step: StepOutput) -> list[Event]:
        """One engine step: its `text` is parsed; its ids (less a stop token) count for usage."""
        ...

    def finish(self) -> tuple[list[Event], ParseResult]:
        """Flush held text; return the remaining events and the whole parse (its
        `reasoning_tokens` counted from the engine's ids)."""
        ...


class PromptPort(Protocol):
    """Conversation -> tokens, and tokens -> events, for the loaded artifact."""

    tokenizer: Tokenizer  # the artifact's (token bytes for logprobs, /tokenize, raw prompts)
    caps: TemplateCapabilities  # what the embedded template supports (reasoning efforts, thinking default)

    def check_options(self, controls: RequestOptions) -> None:
        """Resolve the template options alone (before any capacity is taken); ApiError 400 if invalid."""
        ...

    def prepare(
        self,
        conversation: Conversation,
        controls: RequestOptions,
        tools_present: bool,
        deadline: float | None = None,
    ) -> Prepared:
        """Resolve template options, render and prepare media (until the monotonic `deadline`);
        raises ApiError for any request-caused failure."""
        ...

    def decoder(self, prepared: Prepared, tools: list[Tool]) -> OutputDecoder:
        """A fresh decoder for one response (stop strings are the engine's: its text omits them)."""
        ...


class Handle(Protocol):
    """`ninfer.engine.handle.RequestHandle`: every `iter()` continues where the previous one stopped."""

    @property
    def stats(self) -> RequestStats: ...

    @property
    def finished(self) -> bool:
        """The final output (or an admission error) has been read."""
        ...

    timeout_s: float | None  # per-output wait bound while iterating (None: no bound)

    def __iter__(self) -> Iterator[StepOutput]: ...

    def cancel(self) -> None: ...


class EnginePort(Protocol):
    """What the pipeline needs of the engine."""

    def check_constraint(self, spec: ConstraintSpec) -> None:
        """Compile (and cache) a request's grammar before admission; raises `GrammarError`."""
        ...

    def reserve(self) -> Ticket: ...

    def submit(self, ticket: Ticket, request: GenerationRequest) -> Handle: ...


class Observer(Protocol):
    """Receives the lifecycle of measurement requests (request log, tracing)."""

    def rejected(self, request_id: int, job: GenerationJob, error: ApiError, prepare_s: float) -> None: ...

    def started(
        self,
        request_id: int,
        job: GenerationJob,
        prepared: Prepared,
        request: GenerationRequest,
        stats: RequestStats,
    ) -> None:
        """Submitted: `stats` already holds the engine's resolved sampler and seed."""
        ...

    def done(
        self, request_id: int, job: GenerationJob, summary: dict[str, Any], stats: RequestStats
    ) -> None: ...

    def failed(
        self, request_id: int, job: GenerationJob, error: ApiError, stats: RequestStats | None
    ) -> None: ...
