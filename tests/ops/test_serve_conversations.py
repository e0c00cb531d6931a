"""The conversations mode's reading of a run, on made-up request logs: how each later turn got its
prefix, the cold tier counters over the run, restore against re-prefill and greedy identity (the
restored path needs two GPUs; the served smoke covers the rest on the CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ops.bench import serve_conversations as conv
from ops.bench.serve_client import Result

SCRIPT = conv.Script(
    conversations=2, turns=3, history_tokens=300, output_tokens=8, first_words=180, followup_words=10,
    tokens_per_word=1.3,
)  # fmt: skip


def _done(rid: str | None, path: str = "none", restored: bool = False, parks: int = 0) -> dict[str, Any]:
    return {
        "event": "request_done", "client_request_id": rid, "prefix_reuse_path": path,
        "cold_tier_restored": restored, "cold_tier_parks": parks, "cold_tier_restores": int(restored),
        "timings_seconds": {"ttft": 0.05},
    }  # fmt: skip


def _log(tmp: Path, name: str, events: list[dict[str, Any]], tier: dict[str, Any] | None) -> Path:
    start = {
        "event": "server_start",
        "engine": {"cold_tier": tier},
        "settings": {"cold_tier": {"enabled": tier is not None}},
    }
    path = tmp / f"{name}.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in [start, *events]))
    return path


def _turns(ttft: dict[tuple[int, int], float], texts: dict[tuple[int, int], str]) -> list[conv.Turn]:
    """2 conversations of 3 turns: turn t's prompt is 100 (t + 1) tokens, 50 t of them cached."""
    out = []
    for c in range(2):
        for t in range(3):
            r = Result(200, ttft.get((c, t), 0.1), e2e_s=1.0, itl_s=[0.01], completion_tokens=8)
            r.prompt_tokens, r.cached_tokens, r.text = 100 * (t + 1), 50 * t, texts.get((c, t), f"a{c}{t}")
            out.append(conv.Turn(c, t, f"conv{c}-turn{t}", r))
    return out


def test_split_counters_and_comparison(tmp_path: Path) -> None:
    ids = [f"conv{c}-turn{t}" for c in range(2) for t in range(3)]
    paths = {"conv0-turn1": ("restore_turn_checkpoint", True), "conv0-turn2": ("append_frontier", False),
             "conv1-turn1": ("full_reset", False), "conv1-turn2": ("append_frontier", False)}  # fmt: skip
    tier_events = [_done(None, parks=2)]  # an earlier section's request: its parks are not the run's
    tier_events += [_done(i, *paths.get(i, ("none", False)), parks=5) for i in ids]
    tier_log = _log(
        tmp_path, "tier", tier_events, {"capacity_bytes": 1 << 30, "arenas": [{"device": "cuda:1"}]}
    )
    none_log = _log(
        tmp_path,
        "none",
        [_done(i, "full_reset" if i == "conv0-turn1" else paths.get(i, ("none",))[0]) for i in ids],
        None,
    )
    server_log = tmp_path / "server.log"
    server_log.write_text("")

    tier_turns = _turns({(0, 1): 0.02}, {})
    tier_view = conv.read_log(tier_log, set(ids), wait_s=0)
    assert tier_view.counters["parks"] == 3 and tier_view.counters["restores"] == 1
    summary = {
        **conv.cold_tier_status(tier_view, server_log),
        **conv.summarize_run(SCRIPT, tier_turns, 2.0, tier_view),
    }
    assert summary["cold_tier"] is True and summary["cold_tier_reason"] is None
    assert summary["cold_tier_kind"] == "gpu"
    assert summary["restored"] == 1 and summary["parked"] == 3 and summary["later_turns"] == 4
    split = summary["later_ttft_by_prefix"]
    assert {k: v["turns"] for k, v in split.items()} == {"restored": 1, "resident": 2, "prefill": 1}
    assert split["restored"]["ttft_ms"]["p50"] == 20.0
    assert summary["history_tokens_reached"] == {"mean": 300.0, "max": 300}

    none_view = conv.read_log(none_log, set(ids), wait_s=0)
    status = conv.cold_tier_status(none_view, server_log)
    assert status["cold_tier"] is False and "--no-cold-tier" in status["cold_tier_reason"]
    none_turns = _turns({(0, 1): 0.08}, {(0, 2): "different"})
    tier = conv.Measured(SCRIPT, tier_turns, tier_view, summary)
    none = conv.Measured(SCRIPT, none_turns, none_view, {})
    cmp = conv.compare(tier, none)
    rv = cmp["restore_vs_reprefill"]
    assert rv["pairs"] == 1 and rv["restore_over_reprefill_p50"] == 0.25 and rv["history_tokens_mean"] == 200
    ident = cmp["same_as_reprefilled_run"]  # conv0 from its restored turn 1 on: turn 2 answered differently
    assert (
        ident["restored_conversations"] == 1
        and ident["compared_turns"] == 2
        and ident["identical_turns"] == 1
    )
    assert ident["mismatches"] == [{"conversation": 0, "turn": 2, "prefix": "resident"}]
    assert ident["later_turns_compared"] == 4 and ident["later_turns_identical"] == 3

    assert rv["restore_admitted_ttft_ms"]["p50"] == rv["reprefill_admitted_ttft_ms"]["p50"] == 50.0

    # the identity phase: conv0's turns 1 and 2 restored on the tier's server, conv1's resident
    alone_paths = dict(paths, **{"conv0-turn2": ("restore_turn_checkpoint", True)})
    alone_events = [_done(i, *alone_paths.get(i, ("none", False))) for i in ids]
    alone_log = _log(tmp_path, "alone", alone_events, {"arenas": []})
    never_log = _log(tmp_path, "never", [_done(i, "append_frontier") for i in ids], None)
    alone_view, never_view = conv.read_log(alone_log, set(ids), 0), conv.read_log(never_log, set(ids), 0)
    same = conv.identity(_turns({}, {}), alone_view, _turns({}, {}), never_view)
    assert same["restored_turns"] == same["compared_turns"] == same["identical_turns"] == 2
    assert same["never_evicted_later_turns"] == {"resident": 4} and same["errors"] == 0
    assert same["same_input_turns"] == same["same_input_identical"] == 2
    assert same["first_turns_compared"] == same["first_turns_identical"] == 2
    differs = conv.identity(_turns({}, {}), alone_view, _turns({}, {(0, 2): "b"}), never_view)
    assert differs["identical_turns"] == 1 and differs["mismatches"] == [{"conversation": 0, "turn": 2}]
    assert differs["same_input_identical"] == 1 and differs["first_turns_identical"] == 2
    other = _turns({}, {(1, 0): "b"})  # conv1's first answer differs: no tier involved
    other[1].result.prompt_tokens += 1  # so conv0's turn 1 came with another history
    control = conv.identity(_turns({}, {}), alone_view, other, never_view)
    assert control["first_turns_identical"] == 1 and control["same_input_turns"] == 1

    none_itl = {"itl_ms": {"p50": 12.0}}
    head = conv.headline({**summary, **cmp, "identity": differs, "no_cold_tier": none_itl})
    assert head == {
        "cold_tier_device": "gpu", "restore_ttft_ms": 20.0, "reprefill_ttft_ms": 80.0,
        "restore_over_reprefill": 0.25, "restore_admitted_ttft_ms": 50.0,
        "reprefill_admitted_ttft_ms": 50.0, "restored_turns": 1, "restored_identical": False,
        "lanes_tok_s_ratio": 1.2,
    }  # fmt: skip
    assert conv.headline({**summary, **cmp, "identity": same})["restored_identical"] is True
    assert conv.headline({**summary, **cmp})["restored_identical"] is False  # no identity phase


def test_reason_the_server_gave(tmp_path: Path) -> None:
    log = _log(tmp_path, "one-gpu", [], None)
    server_log = tmp_path / "server.log"
    server_log.write_text("[info] cold tier inactive: no secondary CUDA device with 512 MiB free\n")
    view = conv.read_log(log, set(), wait_s=0)
    assert view.start is not None
    view.start["settings"]["cold_tier"]["enabled"] = True
    status = conv.cold_tier_status(view, server_log)
    assert status == {"cold_tier": False, "cold_tier_reason": "no secondary CUDA device with 512 MiB free",
                      "cold_tier_settings": {"enabled": True}}  # fmt: skip
