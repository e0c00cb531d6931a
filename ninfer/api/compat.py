"""Client-compatibility mode (`--client-compat`): per-request record of accepted deviations.

Real clients (Claude Code, Codex CLI, agent SDKs) send fields the contract refuses. With the mode
off every such field keeps its contract 400, whose message then names `--client-compat`. With it
on, a field that changes nothing this server computes is ignored, a field with a sensible mapping
is mapped, and a tool the server cannot run is left out of the prompt; each adjustment is recorded
(`compat_adjustments` in the request log) so nothing is dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ninfer.api.errors import ApiError

Action = Literal["ignored", "mapped", "dropped_tool"]
HINT = " (start the server with --client-compat to accept it)"
# The order of effort levels across protocols, for the nearest exposed one.
EFFORT_ORDER = ("minimal", "low", "medium", "high", "xhigh", "max")


@dataclass
class Compat:
    """One request's compatibility decisions; `enabled` False keeps the contract's errors."""

    enabled: bool = False
    adjustments: list[dict[str, str]] = field(default_factory=list)

    def _record(self, action: Action, param: str, detail: str) -> None:
        self.adjustments.append({"param": param, "action": action, "detail": detail})

    def _refuse(self, error: ApiError) -> None:
        if not self.enabled:
            if "--client-compat" not in error.message:
                error.message += HINT
                error.args = (error.message,)
            raise error

    def ignore(self, param: str, error: ApiError, detail: str = "accepted and ignored") -> None:
        """Accept a field that changes nothing computed here; raise `error` with the mode off."""
        self._refuse(error)
        self._record("ignored", param, detail)

    def map(self, param: str, error: ApiError, detail: str) -> None:
        """Accept a field by mapping it to what this server does (`detail` says to what)."""
        self._refuse(error)
        self._record("mapped", param, detail)

    def drop_tool(self, param: str, error: ApiError, detail: str) -> None:
        """Leave a tool the server cannot run out of the prompt."""
        self._refuse(error)
        self._record("dropped_tool", param, detail)

    def note(self, param: str, detail: str = "accepted and ignored") -> None:
        """Record a client field the contract already tolerates, when the mode is on."""
        if self.enabled:
            self._record("ignored", param, detail)


def nearest_effort(effort: str, exposed: tuple[str, ...]) -> str | None:
    """The exposed effort closest to `effort` (ties go to the stronger one); None without efforts."""
    if not exposed or effort not in EFFORT_ORDER:
        return None
    rank = EFFORT_ORDER.index(effort)
    ranked = [
        (abs(EFFORT_ORDER.index(e) - rank), -EFFORT_ORDER.index(e), e) for e in exposed if e in EFFORT_ORDER
    ]
    return min(ranked)[2] if ranked else None
