"""The serving benchmark's conversations mode: many multi-turn conversations over few lanes.

N conversations run at once through streaming Chat Completions (history re-sent, temperature 0),
each for `turns` turns: a long first user message and short follow-ups (`followup_tokens`, as in
chat and agent sessions), with the previous answer appended each turn, sized (through the server's
`/tokenize`) so the last turn's prompt is about `history_tokens` long. With more conversations than
the server's lanes, residents are evicted between their turns: parked in the cold tier when it is
on, dropped otherwise (on one GPU, or the CPU, the tier is pinned host memory). Each request
carries an `x-request-id`, so its line in the server's request log (`cached_tokens`,
`prefix_reuse_path`, `cold_tier_restored`, `timings_seconds`) says how the later turn got its
prefix: restored from the cold tier, still resident on its lane, or prefilled again. `compare` sets
a run with the tier against one without it on the same conversations: restore TTFT against
re-prefill TTFT at the same turn (so the same history length), as the client saw it and from the
request's admission to a lane (queueing behind other conversations left out).

Greedy identity is its own phase (`drive_alone`): one request in flight at a time, so every step
runs at batch 1 and no kernel's numerics depend on what else is batched. On the tier's server the
identity conversations go turn by turn over more conversations than lanes (each later turn finds
its lane taken: parked, then restored); on the server without the tier the same conversations go
one after another (each keeps its lane: never evicted). `identity` compares the two answer by answer.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.bench.serve_client import Result, percentiles, post_json, prompt_text, stream, summarize

USER_OVERHEAD = 6  # template tokens around a user message
ANSWER_OVERHEAD = 12  # around an answer, thinking markers included
MIN_WORDS = 8
RESIDENT_PATHS = ("append_frontier", "restore_turn_checkpoint", "restore_response_checkpoint")
COUNTERS = ("parks", "restores", "evictions", "park_failures", "restore_failures")


@dataclass(frozen=True)
class Script:
    """The conversations, the same for every server they run against."""

    conversations: int
    turns: int
    history_tokens: int
    output_tokens: int
    first_words: int  # filler words of the first user message (most of the history)
    followup_words: int  # filler words of every later user message
    tokens_per_word: float

    def user_text(self, conversation: int, turn: int) -> str:
        words = self.first_words if turn == 0 else self.followup_words
        return prompt_text(words, 700_000 + 1000 * conversation + turn)

    def describe(self) -> dict[str, Any]:
        return {
            "conversations": self.conversations,
            "turns": self.turns,
            "history_tokens": self.history_tokens,
            "max_tokens_per_answer": self.output_tokens,
            "first_user_words": self.first_words,
            "followup_user_words": self.followup_words,
            "tokens_per_word": round(self.tokens_per_word, 3),
            "temperature": 0.0,
        }


def plan(
    base: str, conversations: int, turns: int, history_tokens: int, output_tokens: int, followup_tokens: int
) -> Script:
    """User messages sized so that `turns` turns, each answer `output_tokens` long and each
    follow-up `followup_tokens`, reach `history_tokens`: first + (T - 1) (answer + follow-up) = history."""
    sample_words = 200
    status, body = post_json(base, "/tokenize", {"prompt": prompt_text(sample_words, 1)})
    per_word = body["count"] / sample_words if status == 200 and body else 1.3
    answer = output_tokens + ANSWER_OVERHEAD
    followup = max(MIN_WORDS, round((followup_tokens - USER_OVERHEAD) / per_word))
    later = (turns - 1) * (answer + followup * per_word + USER_OVERHEAD)
    first = max(MIN_WORDS, round((history_tokens - later - USER_OVERHEAD) / per_word))
    return Script(conversations, turns, history_tokens, output_tokens, first, followup, per_word)


@dataclass(frozen=True)
class Turn:
    conversation: int
    turn: int
    request_id: str
    result: Result


def _turn(
    base: str,
    model: str,
    script: Script,
    messages: list[dict[str, Any]],
    i: int,
    t: int,
    rid: str,
    max_tokens: int,
) -> Turn:
    """Conversation i's turn t: its user message appended to `messages`, sent, and on success its
    answer appended (the history the next turn re-sends)."""
    messages.append({"role": "user", "content": script.user_text(i, t)})
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
    r = stream(base, "chat", body, request_id=rid)
    if r.status == 200 and r.error is None:
        messages.append({"role": "assistant", "content": r.text})
    return Turn(i, t, rid, r)


def drive(base: str, model: str, script: Script) -> tuple[list[Turn], float]:
    """Every conversation in its own thread, turn after turn; -> turns, wall seconds. A conversation
    whose request fails stops there (its next turn would lack the answer)."""

    def conversation(i: int) -> list[Turn]:
        messages: list[dict[str, Any]] = []
        out = []
        for t in range(script.turns):
            out.append(_turn(base, model, script, messages, i, t, f"conv{i}-turn{t}", script.output_tokens))
            if not _ok(out[-1]):
                break
        return out

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(script.conversations) as pool:
        turns = [t for conv in pool.map(conversation, range(script.conversations)) for t in conv]
    return turns, time.perf_counter() - t0


IDENTITY_BASE = 100  # the identity phase's conversations: numbered apart from the loaded run's


def drive_alone(
    base: str, model: str, script: Script, conversations: int, interleaved: bool, max_tokens: int
) -> list[Turn]:
    """One request in flight at a time, over `conversations` conversations of the script's turns:
    turn by turn across the conversations (`interleaved`: with more conversations than lanes,
    each later turn finds its lane taken) or conversation by conversation (each keeps its lane).
    A conversation whose request fails takes no further turns."""
    ids = [IDENTITY_BASE + c for c in range(conversations)]
    histories: dict[int, list[dict[str, Any]]] = {i: [] for i in ids}
    failed: set[int] = set()
    order = (
        [(i, t) for t in range(script.turns) for i in ids]
        if interleaved
        else [(i, t) for i in ids for t in range(script.turns)]
    )
    out = []
    for i, t in order:
        if i in failed:
            continue
        turn = _turn(base, model, script, histories[i], i, t, f"alone{i}-turn{t}", max_tokens)
        out.append(turn)
        if not _ok(turn):
            failed.add(i)
    return out


def identity(tier: list[Turn], tier_view: LogView, never: list[Turn], never_view: LogView) -> dict[str, Any]:
    """The identity phase: every turn the tier's server restored from the cold tier against the
    same turn of the same conversation on the server that never evicted it, answer for answer."""
    reference = {(t.conversation, t.turn): t for t in never}
    restored = [t for t in tier if prefix_source(tier_view.records.get(t.request_id)) == "restored"]
    pairs = [(t, b) for t in restored if _ok(t) and _ok(b := reference.get((t.conversation, t.turn)))]
    mismatches = [
        {"conversation": t.conversation, "turn": t.turn} for t, b in pairs if t.result.text != b.result.text
    ]
    never_paths = Counter(prefix_source(never_view.records.get(t.request_id)) for t in never if t.turn > 0)
    # same input on both sides: a turn whose history already differs (an earlier answer did) is not
    # the restore's doing
    same_input = [(t, b) for t, b in pairs if t.result.prompt_tokens == b.result.prompt_tokens]
    # the control: first turns are fresh prefills on both servers, no tier involved; one answering
    # differently says the two processes do not compute bit for bit alike on the same input
    firsts = [(t, b) for t in tier if t.turn == 0 and _ok(t) and _ok(b := reference.get((t.conversation, 0)))]
    return {
        "conversations": len({t.conversation for t in tier}),
        "turns": len(tier),
        "errors": sum(1 for t in [*tier, *never] if not _ok(t)),
        "restored_turns": len(restored),
        "compared_turns": len(pairs),
        "identical_turns": _identical(pairs),
        "mismatches": mismatches[:8],
        "same_input_turns": len(same_input),
        "same_input_identical": _identical(same_input),
        "first_turns_compared": len(firsts),
        "first_turns_identical": _identical(firsts),
        "never_evicted_later_turns": dict(sorted(never_paths.items())),  # all "resident" when never evicted
    }


@dataclass
class LogView:
    """What one server's request log says about a set of requests."""

    start: dict[str, Any] | None  # the server_start event
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # request_done / request_error by id
    counters: dict[str, int] = field(default_factory=dict)  # cold tier counters over these requests


def read_log(path: Path, ids: set[str], wait_s: float = 10.0) -> LogView:
    """The log's lines for `ids` (waiting up to `wait_s` for lines written after the stream ended);
    the cold tier's cumulative counters at the last of them less those before the first."""
    deadline = time.monotonic() + wait_s
    while True:
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        view = LogView(next((e for e in events if e["event"] == "server_start"), None))
        before = dict.fromkeys(COUNTERS, 0)
        after = dict.fromkeys(COUNTERS, 0)
        for e in events:
            if e["event"] not in ("request_done", "request_error"):
                continue
            ours = e.get("client_request_id") in ids
            if ours:
                view.records[e["client_request_id"]] = e
            for key in COUNTERS:  # cumulative: the largest value seen so far
                value = int(e.get(f"cold_tier_{key}", 0))
                if ours:
                    after[key] = max(after[key], value)
                elif not view.records:
                    before[key] = max(before[key], value)
        if len(view.records) >= len(ids) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    view.counters = {k: max(0, after[k] - before[k]) for k in COUNTERS}
    return view


def cold_tier_status(view: LogView, server_log: Path) -> dict[str, Any]:
    """Whether the server ran a cold tier, its settings, and when off the reason it gave."""
    start = view.start or {}
    tier = (start.get("engine") or {}).get("cold_tier")
    settings = (start.get("settings") or {}).get("cold_tier")
    out: dict[str, Any] = {"cold_tier": bool(tier), "cold_tier_reason": None, "cold_tier_settings": settings}
    if tier:
        arenas = tier.get("arenas") or []
        out["cold_tier_capacity_bytes"] = tier.get("capacity_bytes")
        out["cold_tier_arenas"] = arenas
        # where images are parked: pinned host memory (an arena on "cpu"), secondary GPUs, or both
        places = {"host" if str(a.get("device")) == "cpu" else "gpu" for a in arenas}
        out["cold_tier_kind"] = "+".join(sorted(places)) or None
        return out
    marker = "cold tier inactive: "
    text = server_log.read_text(errors="replace") if server_log.is_file() else ""
    said = [line.split(marker, 1)[1].strip() for line in text.splitlines() if marker in line]
    if said:
        out["cold_tier_reason"] = said[-1]
    elif settings is not None and not settings.get("enabled", True):
        out["cold_tier_reason"] = "disabled by the settings (--no-cold-tier)"
    elif ((start.get("settings") or {}).get("engine") or {}).get("no_prefix_reuse"):
        out["cold_tier_reason"] = "prefix reuse is off (--no-prefix-reuse)"
    else:
        out["cold_tier_reason"] = "not built; the server logged no reason"
    return out


def prefix_source(record: dict[str, Any] | None) -> str:
    """How a request got its prefix: restored (cold tier), resident (its lane still held it),
    prefill (nothing reused), or error / unlogged."""
    if record is None:
        return "unlogged"
    if record["event"] != "request_done":
        return "error"
    if record.get("cold_tier_restored"):
        return "restored"
    return "resident" if record.get("prefix_reuse_path") in RESIDENT_PATHS else "prefill"


def _ok(t: Turn | None) -> bool:
    return t is not None and t.result.status == 200 and t.result.error is None


def _identical(pairs: list[tuple[Turn, Turn]]) -> int:
    """How many (turn, other turn) pairs answered the same text."""
    return sum(1 for t, b in pairs if t.result.text == b.result.text)


def _mean(values: list[int]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def summarize_run(script: Script, turns: list[Turn], wall_s: float, view: LogView) -> dict[str, Any]:
    """Output tok/s and errors over every turn; later turns' TTFT split by where their prefix came from."""
    whole = summarize([t.result for t in turns], wall_s)
    later = [t for t in turns if t.turn > 0]
    by_source: dict[str, list[Turn]] = {}
    for t in later:
        by_source.setdefault(prefix_source(view.records.get(t.request_id)), []).append(t)
    split = {}
    for source, group in sorted(by_source.items()):
        records = [view.records.get(t.request_id) or {} for t in group]
        split[source] = {
            "turns": len(group),
            "ttft_ms": percentiles(
                [t.result.ttft_s for t in group if _ok(t) and t.result.ttft_s is not None]
            ),
            "server_ttft_ms": percentiles(
                [r["timings_seconds"]["ttft"] for r in records if "timings_seconds" in r]
            ),
            "prompt_tokens_mean": _mean([t.result.prompt_tokens for t in group]),
            "cached_tokens_mean": _mean([t.result.cached_tokens for t in group]),
        }
    last = [t.result.prompt_tokens for t in turns if t.turn == script.turns - 1 and _ok(t)]
    paths = Counter(str((view.records.get(t.request_id) or {}).get("prefix_reuse_path")) for t in later)
    return {
        "requests": whole["requests"],
        "errors": whole["errors"],
        "errors_by_status": whole["errors_by_status"],
        "first_error": whole["first_error"],
        "wall_s": whole["wall_s"],
        "output_tokens": whole["output_tokens"],
        "output_tok_s": whole["output_tok_s"],
        "ttft_ms": whole["ttft_ms"],
        "itl_ms": whole["itl_ms"],
        "history_tokens_reached": {"mean": _mean(last), "max": max(last, default=None)},
        "later_turns": len(later),
        "later_turns_cached": sum(1 for t in later if _ok(t) and t.result.cached_tokens > 0),
        "parked": view.counters.get("parks", 0),
        "restored": len(by_source.get("restored", [])),
        "cold_tier_counters": view.counters,
        "later_ttft_by_prefix": split,
        "reuse_paths": dict(sorted(paths.items())),
    }


@dataclass
class Measured:
    script: Script
    turns: list[Turn]
    view: LogView
    summary: dict[str, Any]


def measure(base: str, model: str, script: Script, request_log: Path, server_log: Path) -> Measured:
    """Run the conversations against one server and read its request log."""
    turns, wall = drive(base, model, script)
    view = read_log(request_log, {t.request_id for t in turns})
    summary = {**cold_tier_status(view, server_log), **summarize_run(script, turns, wall, view)}
    return Measured(script, turns, view, summary)


def compare(tier: Measured, none: Measured) -> dict[str, Any]:
    """The run with the cold tier against the run without it, turn by turn: restore TTFT against
    re-prefill TTFT where the first restored and the second prefilled (client and admitted), and
    how many later turns of a restored conversation answered what the re-prefilled one did."""
    other = {(t.conversation, t.turn): t for t in none.turns}

    def source(m: Measured, t: Turn) -> str:
        return prefix_source(m.view.records.get(t.request_id))

    def both_ok(keep: Callable[[Turn], bool]) -> list[tuple[Turn, Turn]]:
        out = []
        for t in tier.turns:
            b = other.get((t.conversation, t.turn))
            if keep(t) and _ok(t) and b is not None and _ok(b):
                out.append((t, b))
        return out

    first_restored: dict[int, int] = {}
    for t in tier.turns:
        if source(tier, t) == "restored":
            first_restored.setdefault(t.conversation, t.turn)

    def admitted(m: Measured, t: Turn) -> float | None:
        """Server TTFT less the time queued for a lane (what the restore or prefill itself cost)."""
        timings = (m.view.records.get(t.request_id) or {}).get("timings_seconds") or {}
        if "ttft" not in timings:
            return None
        return float(timings["ttft"]) - float(timings.get("queue", 0.0))

    matched = [
        (t, b)
        for t, b in both_ok(lambda t: source(tier, t) == "restored")
        if source(none, b) == "prefill" and t.result.ttft_s is not None and b.result.ttft_s is not None
    ]
    pairs = [(t.result.ttft_s, b.result.ttft_s, t.result.prompt_tokens) for t, b in matched]
    restore = percentiles([p[0] for p in pairs])
    reprefill = percentiles([p[1] for p in pairs])
    restore_in = percentiles([x for t, _ in matched if (x := admitted(tier, t)) is not None])
    reprefill_in = percentiles([x for _, b in matched if (x := admitted(none, b)) is not None])
    ratio = None
    if restore["p50"] is not None and reprefill["p50"]:
        ratio = round(restore["p50"] / reprefill["p50"], 3)
    compared = both_ok(
        lambda t: t.conversation in first_restored and t.turn >= first_restored[t.conversation]
    )
    mismatches = [
        {"conversation": t.conversation, "turn": t.turn, "prefix": source(tier, t)}
        for t, b in compared
        if t.result.text != b.result.text
    ]
    later = both_ok(lambda t: t.turn > 0)
    return {
        "restore_vs_reprefill": {
            "pairs": len(pairs),
            "history_tokens_mean": _mean([p[2] for p in pairs]),
            "restore_ttft_ms": restore,
            "reprefill_ttft_ms": reprefill,
            "restore_over_reprefill_p50": ratio,
            "restore_admitted_ttft_ms": restore_in,
            "reprefill_admitted_ttft_ms": reprefill_in,
        },
        # the loaded runs' answers side by side: a re-prefill computes the history in other chunks
        # and batches than the turns that built it, so in bf16 these need not match (identity is
        # the `identity` phase's)
        "same_as_reprefilled_run": {
            "restored_conversations": len(first_restored),
            "compared_turns": len(compared),
            "identical_turns": _identical(compared),
            "mismatches": mismatches[:8],
            "later_turns_compared": len(later),
            "later_turns_identical": _identical(later),
        },
    }


def headline(conversations: dict[str, Any]) -> dict[str, Any]:
    """The figures a conversations result leads with (top level of its JSON): where the tier
    parked (`host`, `gpu`), restore and re-prefill TTFT p50 over the same later turns, how many
    turns were restored, whether every restored turn answered what the never-evicted run did, and
    the lanes' decode rate while parking over the rate without the tier (from the streams'
    inter-token latency, so restores' shorter TTFT does not count as throughput)."""
    pair = conversations.get("restore_vs_reprefill") or {}
    same = conversations.get("identity") or {}
    none = conversations.get("no_cold_tier") or {}
    itl_tier = (conversations.get("itl_ms") or {}).get("p50")
    itl_none = (none.get("itl_ms") or {}).get("p50")
    restored = same.get("restored_turns")
    return {
        "cold_tier_device": conversations.get("cold_tier_kind"),
        "restore_ttft_ms": (pair.get("restore_ttft_ms") or {}).get("p50"),
        "reprefill_ttft_ms": (pair.get("reprefill_ttft_ms") or {}).get("p50"),
        "restore_over_reprefill": pair.get("restore_over_reprefill_p50"),
        "restore_admitted_ttft_ms": (pair.get("restore_admitted_ttft_ms") or {}).get("p50"),
        "reprefill_admitted_ttft_ms": (pair.get("reprefill_admitted_ttft_ms") or {}).get("p50"),
        "restored_turns": conversations.get("restored"),
        # every turn the identity phase restored answered as the never-evicted conversation did
        "restored_identical": bool(restored)
        and same.get("compared_turns") == restored
        and same.get("identical_turns") == restored,
        "lanes_tok_s_ratio": round(itl_none / itl_tier, 3) if itl_tier and itl_none else None,
    }
