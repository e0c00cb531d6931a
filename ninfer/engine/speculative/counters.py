"""The per-request `speculative` object of request_done: rounds, drafted and accepted draft tokens.

The object is a plain dict (`RequestStats.speculative`) updated in place by the engine thread
before each token's commit, so it is complete when the request's last output is delivered.

* `rounds`: verified rounds; `drafted_tokens`: drafts verified (`draft_window` per round).
* `accepted_tokens`: drafts that reached the output. A stop or the length limit inside an
  accepted run cuts the count where the output was cut, so per request
  `completion_tokens = 1 (from prefill) + fallback_steps + accepted_tokens + rounds`, less one
  when the last round ended before its target token.
* `accepted_per_position[j]`: rounds whose draft j (0-based) was committed; non-increasing in j,
  sums to `accepted_tokens`.
* `fallback_steps`: plain one-token decode steps, taken when a round could not run (the request
  is too close to the end of its KV pages for k+1 rows).
"""

from __future__ import annotations

Counters = dict[str, object]


def new_counters(backend: str, draft_window: int) -> Counters:
    return {
        "backend": backend,
        "draft_window": draft_window,
        "rounds": 0,
        "drafted_tokens": 0,
        "accepted_tokens": 0,
        "fallback_steps": 0,
        "accepted_per_position": [0] * draft_window,
    }


def count(c: Counters, key: str) -> int:
    """One integer field (0 when absent: a request decoded without a speculative backend has none)."""
    value = c.get(key, 0)
    assert isinstance(value, int), f"{key}: {value!r}"
    return value


def _add(c: Counters, key: str, n: int = 1) -> None:
    c[key] = count(c, key) + n


def begin_row(c: Counters, drafted: int) -> None:
    """A decode row starts committing: a verified round of `drafted` drafts, or a fallback step (0).
    A request decoded without a speculative backend has no counters: nothing is counted."""
    if not c:
        return
    if drafted == 0:
        _add(c, "fallback_steps")
        return
    if not 0 < drafted <= count(c, "draft_window"):
        raise ValueError(f"{drafted} drafts in a window of {c['draft_window']}")
    _add(c, "rounds")
    _add(c, "drafted_tokens", drafted)


def commit_draft(c: Counters, position: int) -> None:
    """Draft `position` (0-based) of the current round is being committed."""
    _add(c, "accepted_tokens")
    per = c["accepted_per_position"]
    assert isinstance(per, list)
    per[position] += 1
