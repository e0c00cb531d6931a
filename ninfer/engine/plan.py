"""Plain data passed from the scheduler to the runner (StepPlan) and back (StepResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ninfer.engine.sampler import RowSampler
from ninfer.engine.types import TokenLogprob

if TYPE_CHECKING:
    from ninfer.engine.multimodal import MultimodalPrompt


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
    cached: int  # tokens already in the cache before the chunk (= its first position)
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
    chunk padded to the bucket q, each row with its own cached length, slot, pages and slot ops."""

    chunks: list[PrefillPlan]
    q: int


@dataclass
class DecodeRow:
    seq_id: int
    token: int  # the last committed token, fed now
    cached: int  # tokens already in the cache (= the fed token's position)
    slot: int
    pages: list[int]
    sampler: RowSampler
    rope_delta: int = 0  # multimodal prompts: positions are cached + rope_delta on all three streams


@dataclass
class DecodePlan:
    """One decode round: every decode-ready request, compacted, q = 1."""

    rows: list[DecodeRow]


StepPlan = PrefillPlan | PrefillBatch | DecodePlan


@dataclass
class StepResult:
    """Every step kind's result, per sampled row in plan order (no rows for a non-final prefill
    chunk): the run of tokens offered for commit (one token for a plain decode round or a prompt's
    first token; up to k + 1 for a speculative round, committed in order until the request
    finishes), their logprobs, and the drafts verified and accepted. A speculative round leaves
    GPU work for after the commit: `Runner.settle(result, committed)`, a no-op for other steps."""

    seq_ids: list[int]
    runs: list[list[int]]  # [rows][1..k+1] tokens, each run non-empty
    seconds: float = 0.0
    vision_seconds: float = 0.0  # vision tower time inside a multimodal prefill chunk
    # per row: one entry per token of its run for a row that asked for logprobs, else None
    logprobs: list[list[TokenLogprob] | None] | None = None
    drafted: list[int] = field(default_factory=list)  # [rows] drafts verified (0: no drafts)
    accepted: list[int] = field(default_factory=list)  # [rows] drafts accepted: runs[i][:accepted[i]]
    prompt_logprobs: list[TokenLogprob] | None = None  # a prompt-scoring chunk's, one per target

    def __post_init__(self) -> None:
        n = len(self.seq_ids)
        if not self.drafted and not self.accepted:
            self.drafted, self.accepted = [0] * n, [0] * n
        if not len(self.runs) == len(self.drafted) == len(self.accepted) == n:
            counts = (len(self.runs), len(self.drafted), len(self.accepted))
            raise ValueError(f"{n} rows: (runs, drafted, accepted) of {counts}")
        if self.logprobs is not None and len(self.logprobs) != n:
            raise ValueError(f"{n} rows, {len(self.logprobs)} logprobs")

    @classmethod
    def sampled(
        cls, seq_ids: list[int], tokens: list[int], logprobs: list[TokenLogprob | None] | None = None
    ) -> StepResult:
        """One sampled token per row (a plain decode round, prompts' first tokens), no drafts."""
        lps = None if logprobs is None else [None if lp is None else [lp] for lp in logprobs]
        return cls(seq_ids, [[t] for t in tokens], logprobs=lps)
