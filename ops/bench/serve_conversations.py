"""The serving benchmark's conversations mode: many multi-turn conversations over few lanes.

N conversations run at once through streaming Chat Completions (history re-sent, temperature 0),
each for `turns` turns whose histories grow toward `history_tokens`: every turn appends the
previous answer and a new user message of filler words, sized (through the server's `/tokenize`)
so the last turn's prompt is about `history_tokens` long. With more conversations than the
server's lanes, residents are evicted between their turns: parked in the cold tier when it is on,
dropped otherwise (on one GPU, or the CPU, the tier is pinned host memory). Each request carries an `x-request-id`, so its line in the server's request log
(`cached_tokens`, `prefix_reuse_path`, `cold_tier_restored`) says how the later turn got its
prefix: restored from the cold tier, still resident on its lane, or prefilled again. `compare`
sets a run with the tier against one without it on the same conversations: restore TTFT against
re-prefill TTFT at the same turn (so the same history length), and whether each later turn of a
restored conversation answered the same text (greedy).
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
    user_words: int  # filler words per user message
    tokens_per_word: float

    def user_text(self, conversation: int, turn: int) -> str:
        return prompt_text(self.user_words, 700_000 + 1000 * conversation + turn)

    def describe(self) -> dict[str, Any]:
        return {
            "conversations": self.conversations,
            "turns": self.turns,
            "history_tokens": self.history_tokens,
            "max_tokens_per_answer": self.output_tokens,
            "user_words_per_turn": self.user_words,
            "tokens_per_word": round(self.tokens_per_word, 3),
            "temperature": 0.0,
        }


def plan(base: str, conversations: int, turns: int, history_tokens: int, output_tokens: int) -> Script:
    """User messages sized so that `turns` turns, each answer `output_tokens` long, reach
    `history_tokens`: T * user + (T - 1) * answer = history."""
    sample_words = 200
    status, body = post_json(base, "/tokenize", {"prompt": prompt_text(sample_words, 1)})
    per_word = body["count"] / sample_words if status == 200 and body else 1.3
    answer = output_tokens + ANSWER_OVERHEAD
    user = (history_tokens - (turns - 1) * answer) / turns - USER_OVERHEAD
    words = max(MIN_WORDS, round(user / per_word))
    return Script(conversations, turns, history_tokens, output_tokens, words, per_word)


@dataclass(frozen=True)
class Turn:
    conversation: int
    turn: int
    request_id: str
    result: Result


def drive(base: str, model: str, script: Script) -> tuple[list[Turn], float]:
    """Every conversation in its own thread, turn after turn; -> turns, wall seconds. A conversation
    whose request fails stops there (its next turn would lack the answer)."""

    def conversation(i: int) -> list[Turn]:
        messages: list[dict[str, Any]] = []
        out = []
        for t in range(script.turns):
            messages.append({"role": "user", "content": script.user_text(i, t)})
            body = {
                "model": model,
                "messages": messages,
                "max_tokens": script.output_tokens,
                "temperature": 0.0,
            }
            rid = f"conv{i}-turn{t}"
            r = stream(base, "chat", body, request_id=rid)
            out.append(Turn(i, t, rid, r))
            if r.status != 200 or r.error is not None:
                break
            messages.append({"role": "assistant", "content": r.text})
        return out

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(script.conversations) as pool:
        turns = [t for conv in pool.map(conversation, range(script.conversations)) for t in conv]
    return turns, time.perf_counter() - t0


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
    re-prefill TTFT where the first restored and the second prefilled, and greedy identity of every
    later turn of a restored conversation (from its first restored turn on)."""
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
    pairs = [
        (t.result.ttft_s, b.result.ttft_s, t.result.prompt_tokens)
        for t, b in both_ok(lambda t: source(tier, t) == "restored")
        if source(none, b) == "prefill" and t.result.ttft_s is not None and b.result.ttft_s is not None
    ]
    restore = percentiles([p[0] for p in pairs])
    reprefill = percentiles([p[1] for p in pairs])
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
        },
        "greedy_identity": {
            "restored_conversations": len(first_restored),
            "compared_turns": len(compared),
            "identical_turns": len(compared) - len(mismatches),
            "mismatches": mismatches[:8],
            "later_turns_compared": len(later),
            "later_turns_identical": sum(1 for t, b in later if t.result.text == b.result.text),
        },
    }


def headline(conversations: dict[str, Any]) -> dict[str, Any]:
    """The figures a conversations result leads with (top level of its JSON): where the tier
    parked (`host`, `gpu`), restore and re-prefill TTFT p50 over the same later turns, how many
    turns were restored, whether every restored turn answered what the never-evicted run did, and
    the lanes' decode rate while parking over the rate without the tier (from the streams'
    inter-token latency, so restores' shorter TTFT does not count as throughput)."""
    pair = conversations.get("restore_vs_reprefill") or {}
    same = conversations.get("greedy_identity") or {}
    none = conversations.get("no_cold_tier") or {}
    itl_tier = (conversations.get("itl_ms") or {}).get("p50")
    itl_none = (none.get("itl_ms") or {}).get("p50")
    compared = same.get("compared_turns")
    return {
        "cold_tier_device": conversations.get("cold_tier_kind"),
        "restore_ttft_ms": (pair.get("restore_ttft_ms") or {}).get("p50"),
        "reprefill_ttft_ms": (pair.get("reprefill_ttft_ms") or {}).get("p50"),
        "restore_over_reprefill": pair.get("restore_over_reprefill_p50"),
        "restored_turns": conversations.get("restored"),
        "restored_identical": bool(compared) and same.get("identical_turns") == compared,
        "lanes_tok_s_ratio": round(itl_none / itl_tier, 3) if itl_tier and itl_none else None,
    }
