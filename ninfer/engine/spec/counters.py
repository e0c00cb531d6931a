"""The per-request `speculative` object of request_done: rounds, drafted and accepted draft tokens."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecCounters:
    """Counts of one request's decode rounds.

    A round drafts `draft_window` tokens and verifies them in one target forward. `accepted_tokens`
    counts drafts that reached the output: a stop or the length limit inside an accepted run cuts
    the count where the output was cut, so per request
    `completion_tokens = 1 (from prefill) + fallback_steps + accepted_tokens + rounds`, less one when
    the last round ended before its target token. `accepted_per_position[j]` counts rounds whose
    draft j (0-based) was committed; it is non-increasing in j and sums to `accepted_tokens`.
    `fallback_steps` are plain one-token decode steps taken when a round could not run (too
    close to the end of the request's KV pages).
    """

    backend: str  # "mtp" or "oracle" (the benchmarking aid)
    draft_window: int  # k
    rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    fallback_steps: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.accepted_per_position:
            self.accepted_per_position = [0] * self.draft_window

    def record_round(self, drafted: int, committed_drafts: int) -> None:
        """One verified round: `drafted` proposals, of which the first `committed_drafts` were committed."""
        if not 0 <= committed_drafts <= drafted <= self.draft_window:
            raise ValueError(f"inconsistent round: {committed_drafts} committed of {drafted} drafted")
        self.rounds += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += committed_drafts
        for j in range(committed_drafts):
            self.accepted_per_position[j] += 1

    def record_fallback(self) -> None:
        self.fallback_steps += 1

    def as_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "draft_window": self.draft_window,
            "rounds": self.rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "fallback_steps": self.fallback_steps,
            "accepted_per_position": list(self.accepted_per_position),
        }
