"""Soak a running server on 127.0.0.1 with hostile traffic while a well-behaved client measures itself.

    python ops/soak/soak.py --url http://127.0.0.1:8080 --api-key KEY --duration-s 300 \\
        --pid SERVER_PID --request-log server.requests.jsonl

Attacks, each on its own thread and each loop bounded in count and time: slow headers, slow
bodies, idle sockets, disconnect storms (streaming and not) on the three protocols, bursts past
the admission queue and a small bad-input corpus. Meanwhile one client sends small chats and
records its status codes and latency. Afterwards the server must come back to idle: /health 200
and, with --request-log, a last throughput report with nothing running, waiting or holding a
ticket. With --pid the server's RSS (master and workers, from /proc) is reported before and after.
Prints one JSON report; exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

LOOPBACK = ("127.0.0.1", "localhost")
SOCKETS_PER_ATTACK = 32
CLIENT_TIMEOUT_S = 30.0
SETTLE_S = 30.0
GOOD_RETRIES = 5  # the well-behaved client's retries of a 429 / 503 (after Retry-After)
PROTOCOL_PATHS = ("/v1/chat/completions", "/v1/messages", "/v1/responses")
BAD_INPUTS: dict[str, tuple[str, bytes]] = {  # name -> (path, body); each must get a 4xx
    "not_json": ("/v1/chat/completions", b"{not json"),
    "array_body": ("/v1/chat/completions", b"[]"),
    "wrong_types": ("/v1/chat/completions", b'{"model": 1, "messages": "x"}'),
    "negative_max_tokens": (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}',
    ),
    "bogus_role": ("/v1/messages", b'{"model": "m", "messages": [{"role": "bogus", "content": 1}]}'),
    "object_input": ("/v1/responses", b'{"input": {"nested": [1, 2, {"x": null}]}}'),
    "not_utf8": ("/v1/chat/completions", b"\xff\xfe\x00garbage"),
    "deep_nesting": ("/v1/chat/completions", b'{"a": ' * 2000 + b"1" + b"}" * 2000),
    "unknown_route": ("/v1/nope", b"{}"),
}


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        parts = urlsplit(args.url)
        if parts.hostname not in LOOPBACK:
            raise SystemExit("soak: only loopback servers (127.0.0.1) may be soaked")
        self.host = "127.0.0.1"
        self.port = parts.port or 80
        self.key = args.api_key
        self.model = args.model
        self.deadline = 0.0
        self.lock = threading.Lock()
        self.counts: dict[str, Counter[str]] = {}
        self.latencies: list[float] = []
        self.inputs = {k: v for k, v in BAD_INPUTS.items() if k not in set(args.skip_input)}

    # ----- plumbing -----
    def running(self) -> bool:
        return time.monotonic() < self.deadline

    def count(self, attack: str, outcome: str) -> None:
        with self.lock:
            self.counts.setdefault(attack, Counter())[outcome] += 1

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
            h["x-api-key"] = self.key
        return h

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=CLIENT_TIMEOUT_S)
        try:
            conn.request(method, path, body, self.headers())
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def body(self, path: str, stream: bool, max_tokens: int) -> bytes:
        if path == "/v1/responses":
            doc: dict[str, Any] = {
                "model": self.model,
                "input": "Tell a story.",
                "max_output_tokens": max(16, max_tokens),
            }
        else:
            doc = {"model": self.model, "messages": [{"role": "user", "content": "Tell a story."}]}
            doc["max_tokens"] = max_tokens
        doc["stream"] = stream
        return json.dumps(doc).encode()

    def raw(self, head: bytes) -> socket.socket:
        s = socket.create_connection((self.host, self.port), timeout=5)
        if head:
            s.sendall(head)
        return s

    # ----- the well-behaved client -----
    def good_client(self) -> None:
        """Small chats back to back, as a well-behaved client sends them: a 429 / 503 (the bursts
        fill the admission queue on purpose) is retried after its Retry-After, up to
        GOOD_RETRIES times. Outcomes count each request once, by how it ended; a request that
        never got its 200 is lost."""
        body = self.body("/v1/chat/completions", False, 4)
        while self.running():
            t0 = time.monotonic()
            for attempt in range(GOOD_RETRIES + 1):
                try:
                    status, _, retry_after = self.request_with_retry_after("/v1/chat/completions", body)
                    outcome = str(status)
                except OSError as exc:
                    outcome, retry_after = type(exc).__name__, None
                if outcome not in ("429", "503") or retry_after is None or attempt == GOOD_RETRIES:
                    break
                self.count("good_client_retries", outcome)
                time.sleep(min(retry_after, 5.0))
            took = time.monotonic() - t0
            self.count("good_client", outcome)
            if outcome == "200":
                with self.lock:
                    self.latencies.append(took)
            time.sleep(0.05)

    def request_with_retry_after(self, path: str, body: bytes) -> tuple[int, bytes, float | None]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=CLIENT_TIMEOUT_S)
        try:
            conn.request("POST", path, body, self.headers())
            resp = conn.getresponse()
            value = resp.getheader("Retry-After")
            try:
                retry = float(value) if value is not None else None
            except ValueError:
                retry = None
            return resp.status, resp.read(), retry
        finally:
            conn.close()

    # ----- attacks -----
    def hold(self, name: str, head: bytes, drip: bytes, hold_s: float) -> None:
        """Open connections that send `head`, then `drip` every second, for `hold_s`; repeat."""
        while self.running():
            socks = []
            for _ in range(SOCKETS_PER_ATTACK):
                try:
                    socks.append(self.raw(head))
                except OSError:
                    self.count(name, "connect_failed")
            end = min(self.deadline, time.monotonic() + hold_s)
            while time.monotonic() < end:
                time.sleep(1.0)
                for s in socks:
                    try:
                        if drip:
                            s.sendall(drip)
                    except OSError:
                        self.count(name, "closed_by_server")
            for s in socks:
                s.close()
            self.count(name, "rounds")

    def slow_headers(self) -> None:
        self.hold(
            "slow_headers", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", b"x-slow: 1\r\n", 15.0
        )

    def slow_body(self) -> None:
        head = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{"
        self.hold("slow_body", head, b" ", 15.0)

    def idle(self) -> None:
        self.hold("idle", b"", b"", 10.0)

    def disconnects(self) -> None:
        i = 0
        while self.running():
            path = PROTOCOL_PATHS[i % 3]
            body = self.body(path, stream=bool(i // 3 % 2), max_tokens=64)
            head = (
                f"POST {path} HTTP/1.1\r\nHost: x\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in self.headers().items())
                + f"Content-Length: {len(body)}\r\n\r\n"
            )
            try:
                s = self.raw(head.encode() + body)
                time.sleep(0.05 + 0.1 * (i % 4))
                s.close()
                self.count("disconnects", path)
            except OSError:
                self.count("disconnects", "connect_failed")
            i += 1

    def bursts(self) -> None:
        while self.running():
            threads = [threading.Thread(target=self._burst_one, daemon=True) for _ in range(24)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(CLIENT_TIMEOUT_S + 5)
            time.sleep(1.0)

    def _burst_one(self) -> None:
        try:
            status, _ = self.request(
                "POST", "/v1/chat/completions", self.body("/v1/chat/completions", False, 8)
            )
            self.count("bursts", str(status))
        except OSError as exc:
            self.count("bursts", type(exc).__name__)

    def bad_inputs(self) -> None:
        while self.running():
            for name, (path, body) in self.inputs.items():
                try:
                    status, _ = self.request("POST", path, body)
                    self.count("bad_inputs", f"5xx:{name}" if status >= 500 else str(status))
                except OSError as exc:
                    self.count("bad_inputs", type(exc).__name__)
            time.sleep(0.5)

    # ----- run -----
    def run(self, duration_s: float) -> None:
        self.deadline = time.monotonic() + duration_s
        jobs: list[Callable[[], None]] = [
            self.good_client,
            self.slow_headers,
            self.slow_body,
            self.idle,
            self.disconnects,
            self.bursts,
            self.bad_inputs,
        ]
        threads = [threading.Thread(target=job, name=job.__name__, daemon=True) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(duration_s + CLIENT_TIMEOUT_S + 30)

    def settle(self, request_log: str | None) -> dict[str, Any]:
        """Wait for /health 200 and (with a request log) an idle scheduler report."""
        end = time.monotonic() + SETTLE_S
        state: dict[str, Any] = {"health": None, "scheduler": None}
        while time.monotonic() < end:
            try:
                state["health"] = self.request("GET", "/health")[0]
            except OSError:
                state["health"] = None
            state["scheduler"] = last_scheduler(request_log) if request_log else None
            sched = state["scheduler"]
            idle = (
                sched is None
                or sched.get("running") == sched.get("waiting") == sched.get("live_tickets") == 0
            )
            if state["health"] == 200 and idle and (request_log is None or sched is not None):
                state["idle"] = True
                return state
            time.sleep(0.5)
        state["idle"] = False
        return state


def last_scheduler(path: str) -> dict[str, Any] | None:
    """The scheduler state of the last throughput report in the request log."""
    last = None
    for line in Path(path).read_text().splitlines():
        if '"throughput"' in line:
            event = json.loads(line)
            if event.get("event") == "throughput":
                last = event.get("scheduler")
    return last


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS of the server process and its direct children (the gunicorn workers), in KiB."""
    out: dict[str, int] = {}
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        pids += [int(p) for p in task.read_text().split()]
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out[str(p)] = int(line.split()[1])
        except OSError:
            continue
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--model", default="ninfer-demo")
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--pid", type=int, default=None, help="server PID for RSS before/after")
    parser.add_argument("--request-log", default=None, help="the server's request log, for the idle check")
    parser.add_argument("--skip-input", action="append", default=[], help="leave a named bad input out")
    parser.add_argument("--min-success", type=float, default=0.5, help="good client's least 200 share")
    args = parser.parse_args(argv)
    soak = Soak(args)
    before = rss_kib(args.pid) if args.pid else None
    t0 = time.monotonic()
    soak.run(args.duration_s)
    settle = soak.settle(args.request_log)
    after = rss_kib(args.pid) if args.pid else None
    good = soak.counts.get("good_client", Counter())
    total = sum(good.values())
    lat = sorted(soak.latencies)
    report = {
        "duration_s": round(time.monotonic() - t0, 1),
        "good_client": {
            "requests": total,
            "success_rate": good["200"] / total if total else 0.0,
            "outcomes": dict(good),
            "latency_s": {
                "p50": statistics.median(lat) if lat else None,
                "p99": lat[int(0.99 * (len(lat) - 1))] if lat else None,
                "max": lat[-1] if lat else None,
            },
        },
        "good_client_retries": dict(soak.counts.get("good_client_retries", Counter())),
        "attacks": {k: dict(v) for k, v in soak.counts.items() if not k.startswith("good_client")},
        "settle": settle,
        "rss_kib": {"before": before, "after": after},
    }
    failures = []
    if report["good_client"]["success_rate"] < args.min_success:
        failures.append("good client success rate below --min-success")
    for outcome in soak.counts.get("bad_inputs", Counter()):
        if outcome.startswith("5xx:"):
            failures.append(f"bad input {outcome[4:]} answered 5xx")
    if not settle["idle"]:
        failures.append("server did not return to idle")
    report["failures"] = failures
    print(json.dumps(report, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
