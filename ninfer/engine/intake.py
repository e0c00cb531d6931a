"""Submission intake: validate a request on the caller's thread and resolve its limits, sampling and stops."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ninfer.engine.config import MAX_LOGPROBS, EngineConfig
from ninfer.engine.sampler import DraftConstraint, ResolvedSampling, TokenConstraint, resolve_sampling
from ninfer.engine.speculative import counters as spec_counters
from ninfer.engine.stops import Detokenizer
from ninfer.engine.thinking_budget import ThinkClose, ThinkingBudget
from ninfer.engine.tickets import Ticket
from ninfer.engine.types import ContextLengthExceeded, GenerationRequest, QueueTimeout, RequestStats

if TYPE_CHECKING:
    from ninfer.engine.grammar import Grammars
    from ninfer.engine.speculative.decoder import SpecDecoder


@dataclass(frozen=True)
class Intake:
    """A validated submission, resolved against the engine's configuration."""

    entitlement: int  # tokens the request may generate: max_tokens capped by the context left
    sampling: ResolvedSampling
    stop_ids: frozenset[int]
    detok: Detokenizer | None
    stats: RequestStats
    constraint: TokenConstraint | None = None  # the request's grammar matcher (None: free)


def validate_request(
    request: GenerationRequest,
    ticket: Ticket,
    now: float,
    *,
    config: EngineConfig,
    vocab_size: int,
    has_media: bool,
    default_stop_ids: frozenset[int],
    detokenizer_factory: Callable[[], Detokenizer] | None,
    spec: SpecDecoder | None,
    grammars: Grammars | None = None,
) -> Intake:
    """Validate `request` under `ticket` (errors raise here, synchronously) and resolve it."""
    if ticket.released:
        raise ValueError("submit with a released ticket")
    if now >= ticket.deadline:
        raise QueueTimeout(f"request waited {now - ticket.created:.3f}s before submission")
    prompt = request.prompt_ids
    if not prompt:
        raise ValueError("empty prompt")
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        raise ValueError(f"prompt token id outside the model vocabulary [0, {vocab_size})")
    mm = request.multimodal
    if mm is not None:
        if not has_media:
            raise ValueError("media input needs an engine started with vision enabled")
        if tuple(mm.positions.shape) != (3, len(prompt)):
            raise ValueError(f"multimodal positions must be [3, {len(prompt)}]")
    ctx = config.max_context
    if len(prompt) + 1 > ctx:
        raise ContextLengthExceeded(len(prompt), ctx)
    params = request.params
    max_tokens = config.default_max_tokens if params.max_tokens is None else params.max_tokens
    scoring = params.prompt_logprobs is not None
    if max_tokens < (0 if scoring else 1):
        raise ValueError(f"max_tokens must be >= {0 if scoring else 1}, got {max_tokens}")
    for name, value in (("logprobs", params.logprobs), ("prompt_logprobs", params.prompt_logprobs)):
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")
    if scoring and mm is not None:
        raise ValueError("prompt_logprobs are not computed for prompts with media")
    if params.thinking_budget is not None and params.thinking_budget < 1:
        raise ValueError(f"thinking_budget must be >= 1 (</think> counts), got {params.thinking_budget}")
    preset = config.thinking_preset if request.thinking else config.non_thinking_preset
    resolved = resolve_sampling(params, preset, config.sampling)
    stop_ids = frozenset(params.stop_token_ids) if params.stop_token_ids is not None else default_stop_ids
    if params.ignore_eos:
        stop_ids = frozenset()
    detok = detokenizer_factory() if detokenizer_factory is not None else None
    stats = RequestStats(prompt_tokens=len(prompt), resolved_sampling=resolved.as_dict(), seed=resolved.seed)
    if spec is not None:
        stats.speculative = spec_counters.new_counters(spec.backend, spec.k)
    entitlement = stats.max_tokens = min(max_tokens, ctx - len(prompt))
    constraint: TokenConstraint | None = None
    if request.constraint is not None:
        if grammars is None:
            raise ValueError("constrained output needs an engine with a tokenizer")
        constraint = grammars.constraint(request.constraint, request.thinking, entitlement)
    budget = params.thinking_budget if params.thinking_budget is not None else config.default_thinking_budget
    if request.thinking and budget is not None:
        constraint = thinking_budget(budget, config, constraint)
    return Intake(
        entitlement=entitlement,
        sampling=resolved,
        stop_ids=stop_ids,
        detok=detok,
        stats=stats,
        constraint=constraint,
    )


def thinking_budget(budget: int, config: EngineConfig, inner: TokenConstraint | None) -> ThinkingBudget:
    """The budget's mask around the request's grammar (if any); refused without the close tokens."""
    if not config.think_close or config.think_end_id is None:
        raise ValueError("a thinking budget needs an engine with a tokenizer (the end-of-thinking tokens)")
    if inner is not None and not isinstance(inner, DraftConstraint):
        raise TypeError(f"{type(inner).__name__} cannot carry a thinking budget")
    return ThinkingBudget(budget, ThinkClose.split(config.think_close, config.think_end_id), inner)
