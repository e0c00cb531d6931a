"""One submitted request's record on the engine thread: what it asked for, where it runs, what it made.

The record is created by `Engine.submit` (on the caller's thread) and from then on touched only
by the engine thread. It carries the caller's `RequestHandle`, so delivering an output never
needs a second table. The scheduler's `by_id` is the only table of live records; `waiting` and
`active` are its queue and running set. Tokens already in the cache have one name, `cached`:
the admission's reused prefix (`Admission.cached`), the lane's frontier (`Lane.cached`), a
chunk's or decode row's first position (`PrefillPlan.cached`, `DecodeRow.cached`); the runner
packs them into the step's `cache_lens` tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ninfer.engine.handle import RequestHandle
from ninfer.engine.pages import pages_for
from ninfer.engine.plan import SlotOp
from ninfer.engine.sampler import RowSampler
from ninfer.engine.slots import Lane
from ninfer.engine.stops import StopChecker
from ninfer.engine.tickets import Ticket
from ninfer.engine.types import GenerationRequest, RequestStats, TokenLogprob

# A record's phase: queued -> (restore: the cold tier writes its lane) -> prefill -> decode -> done.
WAITING, RESTORE, PREFILL, DECODE, DONE = "waiting", "restore", "prefill", "decode", "done"


@dataclass(eq=False)
class Request:
    """One submitted request's runtime state (owned by the engine thread after submission)."""

    id: int
    submitted: GenerationRequest  # the prompt and parameters, as the caller prepared them
    handle: RequestHandle  # the caller's end: outputs and the final item go here
    entitlement: int  # output tokens allowed: min(max_tokens, max_context - prompt)
    sampler: RowSampler
    stops: StopChecker
    t_submit: float
    phase: str = WAITING
    lane: Lane | None = None  # set at admission; `lane.cached` is the request's cached length
    generated: list[int] = field(default_factory=list)
    captures: dict[int, list[str]] = field(default_factory=dict)  # position -> checkpoint kinds
    pending_ops: list[SlotOp] = field(default_factory=list)  # slot ops before the first chunk
    # a scoring request's prompt logprobs so far (None for the first prompt token)
    prompt_lps: list[TokenLogprob | None] = field(default_factory=lambda: [None])
    t_admit: float = 0.0
    t_first: float = 0.0
    compiles_at_submit: int = 0  # jit_watch.count() when submitted (RequestStats.compilations)

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.submitted.prompt_ids

    @property
    def ticket(self) -> Ticket:
        """The request's lifetime ticket (its admission deadline)."""
        return self.handle.ticket

    @property
    def stats(self) -> RequestStats:
        return self.handle.stats

    @property
    def need_pages(self) -> int:
        return pages_for(len(self.prompt) + self.entitlement)
