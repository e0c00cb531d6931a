"""NInfer replicas behind SGLang's router (`sglang-router` on PyPI), on 127.0.0.1.

    python ops/router/replicas.py --replicas 3 --conversations 60 --turns 3 --stop-one

Starts N demo replicas on the CPU (`python -m ninfer.service.cli`, one process each, as one
replica per GPU would run) and the router with its `cache_aware` policy (an approximate prefix
tree of the requests each worker served, load-balanced within thresholds), then drives multi-turn
conversations through the router: Chat Completions and Anthropic Messages alternate by
conversation, and every conversation ends with a Responses turn continued by
`previous_response_id`. Reports, as one JSON document:

- prefix reuse: the share of later turns whose `cached_tokens` (Chat) /
  `cache_read_input_tokens` (Messages) is > 0, and, from each replica's request log (every turn
  carries an `x-request-id`; vllm-router forwards it on Chat, not on Messages), how many later
  Chat turns the router kept on their conversation's replica; every kept turn must reuse its
  prefix (a moved one starts cold by design);
- load spread: requests per replica from each replica's `/metrics`
  (`vllm:request_success_total`), and the largest deviation from the mean;
- Responses continuations that found their stored response (200) through the router;
- with `--stop-one`: one replica gets SIGTERM mid-run; afterwards every request must succeed and
  the stopped replica must receive nothing more.

Every loop is bounded in count and time. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
MODEL = "ninfer-demo"
HOST = "127.0.0.1"
NO_THINK = {"enable_thinking": False}
ROUTER = os.environ.get("NINFER_ROUTER_MODULE", "vllm_router")  # or sglang_router
SESSION_HEADER = "x-session-id"  # the router's consistent_hash policy routes on it


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    request_log: Path | None = None  # a replica's --request-log-jsonl

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait(timeout=10)
        return self.proc.returncode


def _spawn(
    name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    log = open(workdir / f"{name}.log", "wb")
    return subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env or os.environ.copy()
    )


def start_replica(index: int, workdir: Path, cache: Path | None, drain_s: float = 10.0) -> Proc:
    """One demo replica on the CPU (small context and queue: a test machine, not a GPU)."""
    port = free_port()
    env = os.environ.copy()
    if cache is not None:
        env["NINFER_CACHE_DIR"] = str(cache)
    name = f"replica{index}"
    request_log = workdir / f"{name}.jsonl"
    argv = [sys.executable, "-m", "ninfer.service.cli", "--host", HOST, "--port", str(port),
            "--device", "cpu", "--max-context", "1024", "--max-concurrency", "4",
            "--max-pending-requests", "64", "--log-stats-interval-ms", "0",
            "--request-log-jsonl", str(request_log), "--set", f"server.drain_timeout_s={drain_s}"]  # fmt: skip
    return Proc(
        name, f"http://{HOST}:{port}", _spawn(name, argv, workdir, env), workdir / f"{name}.log", request_log
    )


def start_router(
    workers: list[str], workdir: Path, policy: str = "cache_aware", module: str = ROUTER
) -> Proc:
    """The router over the replicas: health-checks `/health` (readiness) every second and drops a
    worker after two failures (a 503 while draining; a probe slower than 8 s: on a loaded 2-core
    machine a 2 s bound dropped busy replicas and moved their sessions); retries a request that a
    worker refused."""
    port = free_port()
    argv = [sys.executable, "-m", f"{module}.launch_router", "--host", HOST, "--port", str(port),
            "--worker-urls", *workers, "--policy", policy,
            "--health-check-endpoint", "/health", "--health-check-interval-secs", "1",
            "--health-failure-threshold", "2", "--health-check-timeout-secs", "8",
            "--prometheus-port", str(free_port()), "--prometheus-host", HOST,
            "--log-level", "warning" if module == "vllm_router" else "warn", "--request-timeout-secs", "120"]  # fmt: skip
    if policy == "cache_aware":  # prefix affinity first: a later turn's text shares a third or less
        # of its first turn's when replies are long, and load balancing must not move a session
        # while its replica is merely busy (seen on a loaded 2-core machine: 3 of 6 turns moved)
        argv += [
            "--cache-threshold",
            "0.1",
            "--balance-abs-threshold",
            "64",
            "--balance-rel-threshold",
            "4.0",
        ]
    name = f"router-{policy}"
    return Proc(name, f"http://{HOST}:{port}", _spawn(name, argv, workdir), workdir / f"{name}.log")


def wait_ready(proc: Proc, path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"{proc.name} exited {proc.proc.returncode}: {proc.log.read_text()[-3000:]}")
        try:
            if requests.get(f"{proc.url}{path}", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{proc.name} not ready in {timeout_s}s: {proc.log.read_text()[-3000:]}")


def served(url: str) -> float:
    """Finished requests of one replica (`vllm:request_success_total`, all finish reasons)."""
    text = requests.get(f"{url}/metrics", timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vllm:request_success_total":
                total += s.value
    return total


@dataclass
class Tally:
    later_turns: int = 0
    reused_turns: int = 0
    responses_ok: int = 0
    responses_total: int = 0
    failures: list[str] = field(default_factory=list)
    turn_ids: list[list[str]] = field(default_factory=list)  # each conversation's x-request-ids


@dataclass
class Placement:
    """Where the router put each later turn, read from the replicas' request logs."""

    kept: int = 0  # later turns served by the replica that served the conversation's previous turn
    moved: int = 0  # later turns the router sent elsewhere (a cold prefix there, by design)
    lost: list[str] = field(default_factory=list)  # kept turns that still missed the prefix cache
    unseen: int = 0  # later turns without the id in a log (vllm-router forwards it on Chat only)


def served_by(workers: list[Proc]) -> dict[str, tuple[int, int]]:
    """x-request-id -> (replica index, cached_tokens) for every finished request."""
    out: dict[str, tuple[int, int]] = {}
    for index, w in enumerate(workers):
        if w.request_log is None or not w.request_log.exists():
            continue
        for line in w.request_log.read_text().splitlines():
            event = json.loads(line)
            if event["event"] == "request_done" and event.get("client_request_id"):
                out[event["client_request_id"]] = (index, int(event["cached_tokens"]))
    return out


def placement(tally: Tally, workers: list[Proc]) -> Placement:
    where = served_by(workers)
    out = Placement()
    for ids in tally.turn_ids:
        for prev, cur in pairwise(ids):
            if cur not in where or prev not in where:
                out.unseen += 1
            elif where[cur][0] != where[prev][0]:
                out.moved += 1
            else:
                out.kept += 1
                if where[cur][1] == 0:
                    out.lost.append(cur)
    return out


def _headers(rid: str, session: str) -> dict[str, str]:
    """Every request names itself (x-request-id, in the replica's request log) and its
    conversation (x-session-id: what the router's consistent_hash policy hashes)."""
    return {"x-request-id": rid, SESSION_HEADER: session}


def _chat_turn(router: str, messages: list[dict], max_tokens: int, rid: str, session: str) -> tuple[str, int]:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, **NO_THINK}
    r = requests.post(f"{router}/v1/chat/completions", json=body, timeout=120, headers=_headers(rid, session))
    if r.status_code != 200:
        raise RuntimeError(f"chat {r.status_code}: {r.text[:200]}")
    out = r.json()
    cached = (out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return out["choices"][0]["message"]["content"] or "", int(cached)


def _messages_turn(
    router: str, messages: list[dict], max_tokens: int, rid: str, session: str
) -> tuple[str, int]:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "thinking": {"type": "disabled"}}  # fmt: skip
    headers = {"anthropic-version": "2023-06-01", **_headers(rid, session)}
    r = requests.post(f"{router}/v1/messages", json=body, timeout=120, headers=headers)
    if r.status_code != 200:
        raise RuntimeError(f"messages {r.status_code}: {r.text[:200]}")
    out = r.json()
    text = "".join(b.get("text", "") for b in out["content"] if b.get("type") == "text")
    return text, int(out["usage"].get("cache_read_input_tokens") or 0)


def _responses_pair(router: str, seed: int, max_tokens: int, session: str | None = None) -> bool:
    """A stored Response and its continuation by `previous_response_id`: True when the
    continuation found it (the router sent it to the replica that stored it)."""
    max_tokens = max(16, max_tokens)  # the Responses minimum
    body = {"model": MODEL, "input": f"Note {seed}: remember the word kiwi.", "max_output_tokens": max_tokens,
            "temperature": 0, "store": True}  # fmt: skip
    headers = {SESSION_HEADER: session} if session else {}
    first = requests.post(f"{router}/v1/responses", json=body, timeout=120, headers=headers)
    if first.status_code != 200:
        raise RuntimeError(f"responses {first.status_code}: {first.text[:200]}")
    follow = {"model": MODEL, "input": "Which word?", "previous_response_id": first.json()["id"],
              "max_output_tokens": max_tokens, "temperature": 0}  # fmt: skip
    second = requests.post(f"{router}/v1/responses", json=follow, timeout=120, headers=headers)
    return second.status_code == 200


def conversation(router: str, index: int, turns: int, max_tokens: int, responses: bool) -> Tally:
    """One conversation: `turns` turns on Chat (even index) or Messages (odd index)."""
    tally = Tally()
    topic = ["Lyon", "Oslo", "Kyoto", "Lima", "Cairo", "Perth"][index % 6]
    messages: list[dict] = [{"role": "user", "content": f"Conversation {index}: plan a day in {topic}."}]
    turn_fn = _chat_turn if index % 2 == 0 else _messages_turn
    if index % 2 == 0:
        messages.insert(0, {"role": "system", "content": "You plan short trips."})
    ids: list[str] = []
    tally.turn_ids.append(ids)
    try:
        for turn in range(turns):
            ids.append(f"conversation-{index}-turn-{turn}")
            reply, cached = turn_fn(router, messages, max_tokens, ids[-1], f"conversation-{index}")
            if turn > 0:
                tally.later_turns += 1
                tally.reused_turns += int(cached > 0)
            messages += [
                {"role": "assistant", "content": reply or "ok"},
                {"role": "user", "content": f"And {turn}?"},
            ]
        if responses:
            tally.responses_total += 1
            tally.responses_ok += int(_responses_pair(router, index, max_tokens, f"conversation-{index}"))
    except (requests.RequestException, RuntimeError, KeyError, ValueError) as exc:
        tally.failures.append(f"conversation {index}: {exc}")
    return tally


def drive(
    router: str, first: int, count: int, turns: int, max_tokens: int, clients: int, responses: bool
) -> Tally:
    total = Tally()
    with ThreadPoolExecutor(clients) as pool:
        for t in pool.map(
            lambda i: conversation(router, i, turns, max_tokens, responses), range(first, first + count)
        ):
            total.later_turns += t.later_turns
            total.reused_turns += t.reused_turns
            total.responses_ok += t.responses_ok
            total.responses_total += t.responses_total
            total.failures += t.failures
            total.turn_ids += t.turn_ids
    return total


@contextmanager
def cluster(
    replicas: int, workdir: Path, cache: Path | None, policy: str = "cache_aware", timeout_s: float = 300.0
) -> Iterator[tuple[Proc, list[Proc]]]:
    """Replicas and the router, up and ready; everything stopped on exit."""
    workers = [start_replica(i, workdir, cache) for i in range(replicas)]
    try:
        for w in workers:
            wait_ready(w, "/health", timeout_s)
        with router_over(workers, workdir, policy) as router:
            yield router, workers
    finally:
        for w in workers:
            w.stop()


@contextmanager
def router_over(workers: list[Proc], workdir: Path, policy: str) -> Iterator[Proc]:
    """One more router (its own policy) in front of running replicas; stopped on exit."""
    router = start_router([w.url for w in workers], workdir, policy)
    try:
        wait_ready(router, "/health", 60.0)
        yield router
    finally:
        router.stop()


def spread(counts: list[float]) -> float:
    """The largest relative deviation of a count from the mean (0.25 = +-25 %)."""
    mean = sum(counts) / len(counts)
    return max(abs(c - mean) for c in counts) / mean if mean else 0.0


def run(args: argparse.Namespace) -> dict:
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    report: dict = {"replicas": args.replicas, "conversations": args.conversations, "turns": args.turns,
                    "policy": args.policy}  # fmt: skip
    cache = Path(args.cache) if args.cache else None
    with cluster(args.replicas, workdir, cache, args.policy) as (router, workers):
        t0 = time.monotonic()
        base = [served(w.url) for w in workers]
        main = drive(router.url, 0, args.conversations, args.turns, args.max_tokens, args.clients, True)
        per = [served(w.url) - b for w, b in zip(workers, base, strict=True)]
        placed = placement(main, workers)
        report.update(
            seconds=round(time.monotonic() - t0, 1),
            reuse_ratio=main.reused_turns / main.later_turns if main.later_turns else 0.0,
            kept_on_replica=placed.kept,
            moved_by_router=placed.moved,
            placement_unseen=placed.unseen,
            kept_but_not_reused=placed.lost[:10],
            later_turns=main.later_turns,
            responses_ok=main.responses_ok,
            responses_total=main.responses_total,
            per_replica=per,
            spread=spread(per),
            failures=main.failures[:10],
        )
        if args.stop_one:
            victim = workers[-1]
            victim.proc.send_signal(signal.SIGTERM)
            time.sleep(3.0)  # a few router health checks: the draining replica's /health is 503
            before = [served(w.url) for w in workers[:-1]]
            after_stop = drive(router.url, 1000, args.after_stop, 2, args.max_tokens, args.clients, False)
            report["after_stop"] = {
                "conversations": args.after_stop,
                "failures": after_stop.failures[:10],
                "survivors_served": [served(w.url) - b for w, b in zip(workers[:-1], before, strict=True)],
                "stopped_exit": victim.proc.wait(timeout=60),
            }
    return report


def checks(report: dict, min_reuse: float, max_spread: float) -> list[str]:
    bad = []
    if report["failures"]:
        bad.append(f"failures: {report['failures']}")
    if report["kept_but_not_reused"]:
        bad.append(f"turns on their conversation's replica without reuse: {report['kept_but_not_reused']}")
    if report["reuse_ratio"] < min_reuse:
        bad.append(f"reuse {report['reuse_ratio']:.2f} < {min_reuse}")
    if report["spread"] > max_spread:
        bad.append(f"spread {report['spread']:.2f} > {max_spread}")
    stop = report.get("after_stop")
    if stop is not None and stop["failures"]:
        bad.append(f"after stop: {stop['failures']}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument(
        "--policy",
        default="cache_aware",
        choices=["cache_aware", "consistent_hash"],
        help="cache_aware: prefix tree of request text; consistent_hash: hashes x-session-id",
    )
    ap.add_argument("--conversations", type=int, default=60)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=3)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--stop-one", action="store_true")
    ap.add_argument("--after-stop", type=int, default=6, help="conversations after the stop")
    ap.add_argument("--min-reuse", type=float, default=0.9)
    ap.add_argument("--max-spread", type=float, default=0.25)
    ap.add_argument("--cache", default=None, help="NINFER_CACHE_DIR holding (or to hold) the demo")
    ap.add_argument("--workdir", default="/tmp/ninfer-router-run")
    args = ap.parse_args()
    report = run(args)
    report["problems"] = checks(report, args.min_reuse, args.max_spread)
    print(json.dumps(report, indent=2))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
