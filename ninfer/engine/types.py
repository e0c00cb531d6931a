"""The engine's public seam: plain dataclasses and errors shared by the engine and its callers.

Callers (the offline `LLM`, the HTTP protocol adapters) never touch the model or device
tensors. They reserve a lifetime ticket, prepare a prompt, submit a `GenerationRequest`, and
read `StepOutput`s from the returned handle on their own thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ninfer.engine.multimodal import MultimodalPrompt

FinishReason = Literal["stop", "length", "cancelled", "error"]

ReusePath = Literal[
    "none",  # no prefix reuse attempted or possible (cold start, reuse disabled)
    "full_reset",  # a resident existed but nothing of it could be reused
    "append_frontier",  # the prompt extends a resident's exact execution frontier
    "restore_turn_checkpoint",  # resumed from the turn-boundary checkpoint, tail re-prefilled
    "restore_response_checkpoint",  # resumed from the prompt-frontier (generation prologue) checkpoint
]


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling fields. `None` means: use the process override, else the preset."""

    max_tokens: int | None = 16  # None = the engine's default_max_tokens
    temperature: float | None = None  # 0.0 = greedy
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings, matched across token boundaries, text withheld
    stop_token_ids: tuple[int, ...] | None = None  # None = the model's end-of-turn ids
    ignore_eos: bool = False
    # Log-probabilities of each sampled token and of this many top alternatives (0..20); None = off.
    logprobs: int | None = None
    # Log-probabilities of every prompt token after the first (the model's raw log-softmax at the
    # position before it) and of this many top alternatives (0..20); None = off. Such a request
    # prefills its whole prompt (no prefix reuse) and may ask for max_tokens = 0 (scoring only).
    prompt_logprobs: int | None = None
    # Reasoning tokens allowed before the engine closes the thinking with the template's own
    # end-of-thinking tokens (thinking requests only); None = unlimited.
    thinking_budget: int | None = None


@dataclass(frozen=True)
class ConstraintSpec:
    """A grammar the answer must follow (compiled and cached by `ninfer.engine.grammar`).

    `kind`: "json_schema" (source: the schema as JSON text), "json_object" (any JSON object), or
    "structural_tag" (source: xgrammar's structural tag JSON, for tool calls). With a thinking
    request the reasoning stays free; the grammar starts after the end of thinking."""

    kind: Literal["json_schema", "json_object", "structural_tag"]
    source: str = ""
    strict: bool = True  # json_schema: properties not listed are refused unless the schema allows them
    param: str = field(default="", compare=False)  # the request field it came from (error messages)


@dataclass(frozen=True)
class GenerationRequest:
    """One prepared prompt handed to the engine."""

    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    thinking: bool = True  # selects the thinking / non-thinking sampler preset
    # Prompt positions (token counts) where the engine should keep GDN checkpoints so a later
    # turn can resume there: the end of the closed history (turn boundary) and the prompt
    # frontier after the generation prologue. Both optional; the engine decides what it retains.
    turn_checkpoint: int | None = None
    response_checkpoint: int | None = None
    # Media of an expanded prompt (images / videos): payloads, consumer spans, 3-axis positions.
    # Requires an engine built with a vision tower. The engine closes it when done with it.
    multimodal: MultimodalPrompt | None = None
    constraint: ConstraintSpec | None = None  # grammar-constrained answer (see ConstraintSpec)


@dataclass
class RequestStats:
    """Counters the request log reports for one request (filled by the engine)."""

    prompt_tokens: int = 0
    # the output entitlement, resolved once at intake: the request's max_tokens (or the engine's
    # default) within the context the prompt leaves
    max_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    computed_prefill_tokens: int = 0
    reuse_path: ReusePath = "none"
    resolved_sampling: dict[str, float | int | None] = field(default_factory=dict)
    seed: int | None = None
    # phase seconds, full precision (monotonic clock differences): queue = submit -> admission,
    # prefill = admission -> first token, ttft = submit -> first token, decode = first token ->
    # finish, total = submit -> finish (preparation before submit is the caller's to measure)
    queue_s: float = 0.0
    ttft_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0
    vision_s: float = 0.0  # vision tower seconds of this request's prefill chunks
    speculative: dict[str, object] = field(default_factory=dict)
    # cold tier (empty when inactive): "restored" (this request resumed from a restored image) and
    # the tier's cumulative counters and occupancy (`ninfer.engine.cold_tier.ColdTier.stats`)
    cold_tier: dict[str, object] = field(default_factory=dict)
    # kernels and graphs compiled in the process while this request was live (0 on a warmed
    # server: everything a request can reach compiles before ready; see engine.warmup)
    compilations: int = 0


@dataclass(frozen=True)
class StepOutput:
    """New committed tokens of one request. The last output has `finish_reason` set."""

    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    # For "stop" finishes: the stop string that matched (its text withheld by the caller), or
    # the stop token id (counted in completion tokens, its text not shown).
    stop_string: str | None = None
    stop_token_id: int | None = None
    error: str | None = None
    # Visible text of this step when the engine has a tokenizer (None otherwise): text that may
    # still begin a stop string is held back until disambiguated, a matched stop string and
    # whatever follows it are never included, and stop tokens add no text. The concatenation
    # of all `text` fields of a request is its exact visible output.
    text: str | None = None
    # With `SamplingParams.logprobs`: one entry per token of `token_ids`.
    logprobs: tuple[TokenLogprob, ...] | None = None
    # With `SamplingParams.prompt_logprobs`, on the request's first output only: one entry per
    # prompt token, None for the first (nothing precedes it).
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None


@dataclass(frozen=True)
class TokenLogprob:
    """log-softmax of the processed logits the sampler used (penalties, grammar mask, temperature;
    greedy rows at temperature 1) at the chosen token, and the `top` (id, logprob) alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class EngineError(Exception):
    """Base of the errors the engine reports to callers."""


class EngineOverloaded(EngineError):
    """The lifetime capacity (max_concurrency + max_pending_requests) is full (HTTP 429)."""


class QueueTimeout(EngineError):
    """Admission did not happen before `pending_timeout_ms` elapsed (HTTP 503)."""


class ContextLengthExceeded(EngineError):
    """The prompt plus its output entitlement cannot fit `max_context` (HTTP 400)."""

    def __init__(self, prompt_tokens: int, max_context: int) -> None:
        super().__init__(
            f"prompt of {prompt_tokens} tokens leaves no room for output within max_context={max_context}"
        )
        self.prompt_tokens = prompt_tokens
        self.max_context = max_context


class EngineConfigError(EngineError):
    """The engine settings cannot work (rejected at startup, one clear line)."""


class EngineStopped(EngineError):
    """The engine is draining or stopped and accepts no new requests (HTTP 503)."""
