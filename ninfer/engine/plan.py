"""Plain data passed from the scheduler to the runner (StepPlan) and back (StepResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ninfer.engine.sampler import RowSampler
from ninfer.engine.types import TokenLogprob

if TYPE_CHECKING:
    from ninfer.engine.multimodal import MultimodalPrompt
    from ninfer.engine.speculative.decoder import SpecRound


@dataclass(frozen=True)
class SlotOp:
    """A GDN state-slot operation run by the runner: copy `src` into `dst`, or zero `dst`."""

    dst: int
    src: int | None = None  # None = zero the slot


@dataclass
class PrefillPlan:
    """One chunk of one request's prompt: B = 1, q = len(tokens)."""

    seq_id: int
    tokens: list[int]  # the chunk's token ids
    start: int  # tokens already in the cache before the chunk (= first position)
    slot: int
    pages: list[int]
    ops_before: list[SlotOp] = field(default_factory=list)  # restores / resets
    ops_after: list[SlotOp] = field(default_factory=list)  # checkpoint captures at the chunk end
    sampler: RowSampler | None = None  # set on the prompt's last chunk: sample the first token
    multimodal: MultimodalPrompt | None = None  # the request's media: chunk embeddings and positions
    cuda_graph: bool = True  # False: the eager forward even where a captured bucket fits (warm-up)
    # prompt logprobs (top alternatives; None = off): the chunk's positions score `targets`, the
    # prompt tokens that follow each of them (one fewer than `tokens` on the prompt's last chunk)
    prompt_logprobs: int | None = None
    targets: list[int] = field(default_factory=list)


@dataclass
class PrefillBatch:
    """Short chunks of several requests' prompts in one replay of a captured (B, q) graph: each
    chunk padded to the bucket q, each row with its own start, slot, pages and slot ops."""

    chunks: list[PrefillPlan]
    q: int


@dataclass
class DecodeRow:
    seq_id: int
    token: int  # the last committed token, fed now
    position: int  # its position (= tokens already in the cache)
    slot: int
    pages: list[int]
    sampler: RowSampler
    rope_delta: int = 0  # multimodal prompts: positions are position + rope_delta on all three streams


@dataclass
class DecodePlan:
    """One decode round: every decode-ready request, compacted, q = 1."""

    rows: list[DecodeRow]


StepPlan = PrefillPlan | PrefillBatch | DecodePlan


@dataclass
class StepResult:
    """Sampled tokens, one per sampled row, in plan order (empty for a non-final prefill chunk)."""

    seq_ids: list[int]
    tokens: list[int]
    seconds: float = 0.0
    vision_seconds: float = 0.0  # vision tower time inside a multimodal prefill chunk
    # speculative decode rounds: per-row runs of tokens to commit, and the state fix-up to call
    spec: SpecRound | None = None
    logprobs: list[TokenLogprob | None] | None = None  # per row, for rows that asked for logprobs
    prompt_logprobs: list[TokenLogprob] | None = None  # a prompt-scoring chunk's, one per target
