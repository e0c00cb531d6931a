"""The closing lines on stderr: tokens, timing, throughput and the speculative statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ninfer.api.events import Finished
from ninfer.engine.speculative.counters import count
from ninfer.engine.types import RequestStats


@dataclass
class Outcome:
    """What one generation left behind for the report (filled by the pipeline's observer)."""

    prepare_s: float = 0.0
    stats: RequestStats = field(default_factory=RequestStats)
    summary: dict[str, Any] = field(default_factory=dict)


def _rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds:.1f} tok/s" if seconds > 0 and tokens > 0 else "-"


def lines(prog: str, final: Finished, outcome: Outcome, load_s: float) -> list[str]:
    """One line of tokens and timing; one of speculation when a drafter ran."""
    usage, stats = final.usage, outcome.stats
    decode_tokens = max(0, usage.completion_tokens - 1)  # the first token comes from the prefill
    out = [
        f"{prog}: finish {final.finish}; {usage.prompt_tokens} prompt tokens ({usage.cached_tokens} cached), "
        f"{usage.completion_tokens} generated ({usage.reasoning_tokens} reasoning); load {load_s:.2f} s, "
        f"prepare {outcome.prepare_s:.3f} s, TTFT {stats.ttft_s:.3f} s (prefill "
        f"{_rate(usage.prompt_tokens - usage.cached_tokens, stats.prefill_s)}), decode {stats.decode_s:.3f} s "
        f"({_rate(decode_tokens, stats.decode_s)}), total {stats.total_s:.3f} s"
    ]
    spec = stats.speculative
    if spec:
        rounds, drafted, accepted = (count(spec, k) for k in ("rounds", "drafted_tokens", "accepted_tokens"))
        rate = f"{100.0 * accepted / drafted:.1f} %" if drafted else "-"
        per_round = f"{(accepted + rounds) / rounds:.2f}" if rounds else "-"
        out.append(
            f"{prog}: speculative {spec.get('backend')} (k={spec.get('draft_window')}): {rounds} rounds, "
            f"{drafted} drafted, {accepted} accepted ({rate}), {per_round} tokens per round, "
            f"accepted per position {spec.get('accepted_per_position')}, "
            f"{spec.get('fallback_steps', 0)} plain steps"
        )
    return out
