"""Serving benchmark: what a user gets over HTTP, beside what the engine does alone, in one run.

    python ops/bench/serve.py ARTIFACT --model qwen3.6-27b --out DIR [--smoke] [-- server flags...]

Starts `ninfer-serve ARTIFACT` (with `--max-concurrency 8 --max-context 4096` unless given after
`--`), waits for `/health`, and drives it with streaming clients over real HTTP, each request on
its own connection:
- `first`: 8 requests sent the moment the server says ready (TTFT of the first, any 5xx);
- `c1`, `c8`, `c32`: closed loops of 1 client, 8 clients arriving together, 32 clients over the
  server's 8 lanes; output tok/s, TTFT / ITL / end-to-end p50 / p90 / p99, errors by status;
- `poisson`: arrivals at `--rate` per second;
- `lengths`: one request per prompt length from 32 to 8k tokens (TTFT; shows compile outliers);
- `multi_turn`: conversations through Chat (history re-sent) and Responses
  (`previous_response_id`); every later turn should report cached tokens;
- `conversations` (with `--conversations N`): N streaming multi-turn conversations at temperature 0
  whose histories grow to `--history-tokens` in `--turns` turns, more of them than the server has
  lanes, so residents are evicted (parked in the cold tier when the server has one); later turns'
  TTFT split by how the request log says each got its prefix (`cold_tier_restored`,
  `prefix_reuse_path`), output tok/s, errors, and whether the server ran a cold tier (the reason
  when not). `--compare-no-cold-tier` then runs the same conversations on a second server with
  `--no-cold-tier`: restore TTFT against re-prefill TTFT at the same turn; with
  `--identity-conversations K` (more than the lanes) both servers also run K conversations one
  request at a time (batch 1), interleaved with the tier (each later turn restored) and one after
  another without it (never evicted), and compare the answers (`ops/bench/serve_conversations.py`).
  To run it alone: `--skip first,c1,c8,c32,poisson,lengths,multi_turn,soak,engine` (the result is
  then `DATE-COMMIT-conversations-MODEL.json`, led by the tier's headline figures);
- `soak`: 32 clients for `--soak-s` seconds (requests, errors).
Then it reads the server's compilations after ready (`/health` `late_compiles`), stops it, and
measures the engine alone on the same artifact with the same settings (batch 1 and 8 tok/s, TTFT
of 8 prompts arriving together). One JSON lands in `--out`
(`DATE-COMMIT-serve-MODEL[-WEIGHTS].json`, WEIGHTS for anything but bf16: the profile, or
`seed-v3-groupwise-int` for a seed file; `weights` and `format` in it say which). `--smoke` runs every section small (4 clients where 8 or 32 would be), on the CPU (the test suite).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops.bench import serve_conversations as conversations
from ops.bench.report import artifact_args, provenance, write_json
from ops.bench.serve_client import Result, get_json, prompt_text, stream, summarize


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`ninfer-serve` in a subprocess: started, waited for, stopped."""

    def __init__(self, artifact: str, flags: list[str], log_dir: Path, name: str = "serve") -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.request_log = log_dir / f"{name}-requests.jsonl"
        self.argv = [artifact, "--port", str(self.port), "--request-log-jsonl", str(self.request_log), *flags]
        self.server_log = log_dir / f"{name}-server.log"
        self.stdout = open(self.server_log, "w")
        cmd = [sys.executable, "-m", "ninfer.service.cli", *self.argv]
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdout=self.stdout, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.ready_s: float | None = None

    def wait_ready(self, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited with {self.proc.returncode} before ready")
            try:
                status, _ = get_json(self.base, "/health", timeout=2.0)
            except OSError:
                status = 0
            if status == 200:
                self.ready_s = time.monotonic() - self.t_start
                return self.ready_s
            time.sleep(0.05)
        raise SystemExit(f"the server was not ready within {timeout_s:.0f}s")

    def health(self) -> dict[str, Any]:
        _, body = get_json(self.base, "/health")
        return body or {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.stdout.close()


@dataclass(frozen=True)
class Sizes:
    """Requests per section: the full run, a quick one (both models in one GPU call), the CPU smoke."""

    name: str
    burst: int  # clients of the burst at ready and of c8
    c1: int  # requests of the single client
    c8: int  # requests per client at 8 clients
    c32: int  # requests per client at 32 clients (0: skipped)
    poisson: int
    lengths: tuple[int, ...]  # prompt words (about 1.3 tokens each)
    conversations: int  # per protocol
    turns: int
    soak_s: float | None  # None: --soak-s
    output_tokens: int | None  # None: --output-tokens


FULL = Sizes("full", 8, 4, 2, 3, 48, (20, 45, 90, 190, 380, 770, 1540, 3000, 6000), 8, 4, None, None)
QUICK = Sizes("quick", 8, 2, 1, 1, 16, (20, 190, 770, 3000, 6000), 4, 3, None, None)
SMOKE = Sizes("smoke", 4, 1, 1, 0, 4, (60,), 1, 2, 2.0, 4)


class Load:
    """Request bodies: `--prompt-words` random words, `--output-tokens` max tokens."""

    def __init__(self, model: str, words: int, output_tokens: int) -> None:
        self.model, self.words, self.output_tokens = model, words, output_tokens
        self._seed = 0

    def chat(self, words: int | None = None) -> dict[str, Any]:
        self._seed += 1
        text = prompt_text(self.words if words is None else words, self._seed)
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": self.output_tokens,
        }


def closed_loop(base: str, load: Load, clients: int, per_client: int) -> tuple[list[Result], float]:
    """`clients` threads, each sending `per_client` requests back to back; -> results, wall seconds."""

    def client(_: int) -> list[Result]:
        return [stream(base, "chat", load.chat()) for _ in range(per_client)]

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(clients) as pool:
        results = [r for batch in pool.map(client, range(clients)) for r in batch]
    return results, time.perf_counter() - t0


def timed_loop(base: str, load: Load, clients: int, seconds: float) -> tuple[list[Result], float]:
    """`clients` threads sending requests back to back until `seconds` have passed."""
    stop_at = time.monotonic() + seconds

    def client(_: int) -> list[Result]:
        out = []
        while time.monotonic() < stop_at:
            out.append(stream(base, "chat", load.chat()))
            if out[-1].status in (429, 503):  # a well-behaved client backs off
                time.sleep(0.5)
        return out

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(clients) as pool:
        results = [r for batch in pool.map(client, range(clients)) for r in batch]
    return results, time.perf_counter() - t0


def poisson(base: str, load: Load, rate: float, count: int, seed: int = 0) -> tuple[list[Result], float]:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(min(count, 64)) as pool:
        futures = []
        for _ in range(count):
            futures.append(pool.submit(stream, base, "chat", load.chat()))
            time.sleep(rng.expovariate(rate))
        results = [f.result() for f in futures]
    return results, time.perf_counter() - t0


def lengths(base: str, load: Load, words: list[int]) -> list[dict[str, Any]]:
    out = []
    for w in words:
        body = load.chat(w)
        body["max_tokens"] = 8
        r = stream(base, "chat", body)
        out.append({"prompt_tokens": r.prompt_tokens, "status": r.status, "ttft_ms": _ms(r.ttft_s)})
    return out


def multi_turn(base: str, load: Load, conversations: int, turns: int) -> dict[str, Any]:
    """Chat (history re-sent) and Responses (`previous_response_id`) conversations, run in parallel."""

    def chat_conv(i: int) -> list[Result]:
        messages: list[dict[str, Any]] = []
        out = []
        for t in range(turns):
            messages.append({"role": "user", "content": prompt_text(load.words, 10_000 + i * 100 + t)})
            r = stream(base, "chat", {"model": load.model, "messages": messages, "max_tokens": 32})
            out.append(r)
            messages.append({"role": "assistant", "content": r.text})
        return out

    def responses_conv(i: int) -> list[Result]:
        prev = None
        out = []
        for t in range(turns):
            body: dict[str, Any] = {
                "model": load.model, "input": prompt_text(load.words, 20_000 + i * 100 + t), "max_output_tokens": 32,
            }  # fmt: skip
            if prev is not None:
                body["previous_response_id"] = prev
            r = stream(base, "responses", body)
            out.append(r)
            prev = r.response_id
        return out

    with cf.ThreadPoolExecutor(2 * conversations) as pool:
        chats = list(pool.map(chat_conv, range(conversations)))
        resps = list(pool.map(responses_conv, range(conversations)))
    later = [r for conv in (*chats, *resps) for r in conv[1:]]
    return {
        "conversations": {"chat": conversations, "responses": conversations},
        "turns": turns,
        "later_turns": len(later),
        "later_turns_cached": sum(1 for r in later if r.status == 200 and r.cached_tokens > 0),
        "errors": sum(1 for conv in (*chats, *resps) for r in conv if r.status != 200),
        "cached_tokens_mean": round(sum(r.cached_tokens for r in later) / max(1, len(later)), 1),
    }


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000, 3)


def engine_alone(argv: list[str], words: int, output_tokens: int, smoke: bool) -> dict[str, Any]:
    """The same artifact and settings through the engine, no HTTP: batch 1 and 8 tok/s (first
    submission to last token, as the clients measure), and the TTFT of 8 prompts arriving together.
    Each batch size runs once unmeasured first, as the served figures follow the server's `first`
    burst (at 8a41129 the 35B-A3B's one measured batch of 8 in a fresh process met a compilation
    and read 0.8x of the served figure)."""
    from ninfer.artifact import open_artifact
    from ninfer.bootstrap import build_engine
    from ninfer.config.loader import load_settings
    from ninfer.engine.types import GenerationRequest, SamplingParams
    from ninfer.service.cli import translate
    from ninfer.text.tokenizer import Tokenizer

    settings = load_settings(translate(argv))
    artifact = open_artifact(argv[0])
    tok = Tokenizer.from_file(artifact.tokenizer_path)
    engine = build_engine(settings, artifact).start()
    engine.wait_ready()
    seed = [50_000]

    def prompt() -> tuple[int, ...]:
        seed[0] += 1
        text = f"<|im_start|>user\n{prompt_text(words, seed[0])}<|im_end|>\n<|im_start|>assistant\n<think>\n"
        return tuple(tok.encode(text))

    def run(n: int) -> tuple[float, int, list[float]]:
        t0 = time.perf_counter()
        handles = [
            engine.submit(engine.reserve(), GenerationRequest(f"e{i}", prompt(), SamplingParams(max_tokens=output_tokens)))
            for i in range(n)
        ]  # fmt: skip
        tokens = 0
        for h in handles:
            with h:
                got, _ = h.result(3600)
                tokens += len(got)
        wall = time.perf_counter() - t0
        return wall, tokens, [h.stats.ttft_s for h in handles]

    wide = 4 if smoke else 8
    try:
        run(1)  # the same warm state the server's clients met after `first`
        w1, t1, _ = run(1)
        run(wide)
        compiles = engine.late_compiles()
        w8, t8, ttft8 = run(wide)
    finally:
        engine.shutdown(5.0)
    ttft8.sort()
    return {
        "engine_tok_s": {"1": round(t1 / w1, 2), "8": round(t8 / w8, 2)},
        "engine_ttft_ms_c8": round(ttft8[-1] * 1000, 3),  # p99 of 8 = the largest
        "engine_late_compiles": engine.late_compiles(),
        "engine_late_compiles_measured": engine.late_compiles() - compiles,  # in the timed batch of 8
    }


def _conversations(server: Server, model_id: str, script: conversations.Script) -> conversations.Measured:
    return conversations.measure(server.base, model_id, script, server.request_log, server.server_log)


@dataclass
class Alone:
    """The identity phase on one server: its turns and what its request log says of them."""

    turns: list[conversations.Turn]
    view: conversations.LogView


def _alone(server: Server, model_id: str, script: conversations.Script, args: argparse.Namespace,
           interleaved: bool) -> Alone:  # fmt: skip
    turns = conversations.drive_alone(
        server.base, model_id, script, args.identity_conversations, interleaved,
        args.identity_tokens or script.output_tokens,
    )  # fmt: skip
    return Alone(turns, conversations.read_log(server.request_log, {t.request_id for t in turns}))


def _compare_no_cold_tier(
    flags: list[str], args: argparse.Namespace, with_tier: conversations.Measured, alone: Alone | None
) -> dict[str, Any]:
    """The same conversations on a fresh server without the cold tier: its summary under
    `no_cold_tier`, restore against re-prefill, and (after the tier's server ran its identity
    phase, `alone`) the same identity conversations one after another, never evicted."""
    script = with_tier.script
    server = Server(args.artifact, [*flags, "--no-cold-tier"], args.out, name="serve-no-cold-tier")
    never: Alone | None = None
    try:
        ready_s = server.wait_ready(args.ready_timeout_s)
        _, models = get_json(server.base, "/v1/models")
        model_id = models["data"][0]["id"]
        without = _conversations(server, model_id, script)
        if alone is not None:
            never = _alone(server, model_id, script, args, interleaved=False)
    finally:
        server.stop()
    out = {
        "no_cold_tier": {"ready_s": round(ready_s, 3), **without.summary},
        **conversations.compare(with_tier, without),
    }
    if alone is not None and never is not None:
        out["identity"] = conversations.identity(alone.turns, alone.view, never.turns, never.view)
    return out


def _ratios(result: dict[str, Any]) -> None:
    """Served tok/s as a fraction of the engine's at the same batch (c32 runs 8 lanes)."""
    eng, http = result["engine_tok_s"], result["http"]
    for key, batch in (("c1", "1"), ("c8", "8"), ("c32", "8")):
        if key in http and eng[batch]:
            http[key]["of_engine"] = round((http[key]["output_tok_s"] or 0) / eng[batch], 3)


def _weights(artifact: str) -> tuple[str, str]:
    """(weights, format) of the artifact: a directory's weight profile (`bf16`, `groupwise-int`,
    `fp8`, ...) and "ninfer directory"; a seed file's `seed-v<N>-<profile>`, the profile whose
    per-tensor formats its text and MTP tensors carry (`mixed` when none does), and its container."""
    from ninfer.artifact import open_artifact
    from ninfer.artifact.profiles import PROFILES, format_for

    art = open_artifact(artifact)
    if not Path(artifact).is_file():
        return art.weight_profile, "ninfer directory"
    stored = {
        name: (spec.fmt if (spec := art.quantized.get(comp, {}).get(name)) else None)
        for comp in ("text", "mtp")
        if comp in art.manifest.components
        for name in art.tensor_infos(comp)
    }
    recipe = next(
        (
            p
            for p in PROFILES
            if all(format_for(p, art.config, art.model_id, n) == f for n, f in stored.items())
        ),
        "mixed",
    )
    version = art.manifest.created_by.rpartition("v")[2]
    return f"seed-v{version}-{recipe}", art.manifest.created_by


def main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    p, own, server = artifact_args(__doc__, raw)  # server flags follow "--"
    p.add_argument(
        "--quick", action="store_true", help="fewer requests per section (one GPU call for both models)"
    )
    p.add_argument("--prompt-words", type=int, default=24, help="~32 prompt tokens with the template")
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals per second")
    p.add_argument("--soak-s", type=float, default=180.0)
    p.add_argument("--ready-timeout-s", type=float, default=900.0)
    p.add_argument(
        "--skip",
        default="",
        help="comma-separated sections to skip (first,c1,c8,c32,poisson,lengths,multi_turn,soak,engine)",
    )
    p.add_argument(
        "--conversations",
        type=int,
        default=0,
        help="N concurrent multi-turn conversations over the server's lanes (0: none)",
    )
    p.add_argument("--turns", type=int, default=4, help="turns per conversation of --conversations")
    p.add_argument(
        "--history-tokens",
        type=int,
        default=None,
        help="the history a conversation reaches at its last turn (default 4096; 160 with --smoke)",
    )
    p.add_argument(
        "--followup-tokens",
        type=int,
        default=None,
        help="tokens of every user message after a conversation's first, which holds the rest of "
        "the history (default 256; 16 with --smoke)",
    )
    p.add_argument(
        "--identity-conversations",
        type=int,
        default=0,
        help="with --compare-no-cold-tier: conversations (more than the lanes) run one request at a "
        "time, interleaved on the tier's server and one after another without it, answers compared",
    )
    p.add_argument(
        "--identity-tokens", type=int, default=None, help="max tokens per answer of the identity phase"
    )
    p.add_argument(
        "--compare-no-cold-tier",
        action="store_true",
        help="run the conversations again on a server with --no-cold-tier and compare",
    )
    p.add_argument("--engine-into", type=Path, default=None,
                   help="only the engine-alone figures, added to this earlier result JSON of the same artifact")  # fmt: skip
    args = p.parse_args(own)
    # 32 clients over 8 lanes: every client holds a ticket (8 running + 24 pending)
    flags = server or [
        "--max-concurrency",
        "8",
        "--max-context",
        "4096",
        "--max-pending-requests",
        "32",
    ]
    skip = set(filter(None, args.skip.split(",")))
    size = SMOKE if args.smoke else QUICK if args.quick else FULL
    out_tokens = size.output_tokens or args.output_tokens
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"model": args.model, "artifact": args.artifact, "server_flags": flags,
                              "prompt_words": args.prompt_words, "output_tokens": out_tokens,
                              "profile": size.name, "complete": False}  # fmt: skip
    meta = provenance("ops/bench/serve.py", raw)
    weights, result["format"] = _weights(args.artifact)
    result["weights"] = weights
    tag = "" if weights == "bf16" else f"-{weights}"
    # a run of the conversations alone (the HTTP load sections skipped) is named for them
    only_conversations = args.conversations and {"c1", "c8", "c32"} <= skip
    kind = "conversations" if only_conversations else "serve"
    path = args.out / f"{meta['date'][:10]}-{meta['commit']}-{kind}-{args.model}{tag}.json"

    def save() -> None:  # after every section: a run cut short still leaves what it measured
        write_json(path, {**meta, **result})

    if args.engine_into is not None:  # a served run cut short before its engine figures
        done = json.loads(args.engine_into.read_text())
        done.update(
            engine_alone(
                [args.artifact, *done["server_flags"]], done["prompt_words"], done["output_tokens"], False
            )
        )
        done["engine_measured"] = {k: meta[k] for k in ("commit", "date", "command")}
        _ratios(done)
        write_json(args.engine_into, done)
        print(f"updated {args.engine_into}")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout still stops the server
    server = Server(args.artifact, flags, args.out)
    with_tier: conversations.Measured | None = None
    alone: Alone | None = None  # the identity phase on the tier's server
    try:
        result["ready_s"] = round(server.wait_ready(args.ready_timeout_s), 3)
        _, models = get_json(server.base, "/v1/models")
        model_id = models["data"][0]["id"]
        result["synthetic_weights"] = bool(models["data"][0].get("synthetic_weights"))
        load = Load(model_id, args.prompt_words, out_tokens)
        http: dict[str, Any] = {}
        result["http"] = http
        if "first" not in skip:  # sent the moment the server said ready
            first, wall = closed_loop(server.base, load, size.burst, 1)
            result["first_after_ready_ttft_ms"] = _ms(min(r.ttft_s or 1e9 for r in first))
            result["first_after_ready"] = summarize(first, wall)
        if "c1" not in skip:
            http["c1"] = summarize(*closed_loop(server.base, load, 1, size.c1))
            result["steady_ttft_ms"] = http["c1"]["ttft_ms"]["p50"]
        if "c8" not in skip:
            http["c8"] = summarize(*closed_loop(server.base, load, size.burst, size.c8))
        save()
        if "c32" not in skip and size.c32:
            http["c32"] = summarize(*closed_loop(server.base, load, 32, size.c32))
            save()
        if "poisson" not in skip:
            http["poisson"] = {
                "rate": args.rate,
                **summarize(*poisson(server.base, load, args.rate, size.poisson)),
            }
        if "lengths" not in skip:
            result["lengths"] = lengths(server.base, load, list(size.lengths))
        if "multi_turn" not in skip:
            result["multi_turn"] = multi_turn(server.base, load, size.conversations, size.turns)
        save()
        if args.conversations:
            history = args.history_tokens or (160 if args.smoke else 4096)
            script = conversations.plan(
                server.base,
                args.conversations,
                args.turns,
                history,
                out_tokens,
                args.followup_tokens or (16 if args.smoke else 256),
            )
            with_tier = _conversations(server, model_id, script)
            result["conversations"] = {**script.describe(), **with_tier.summary}
            save()
            if args.identity_conversations and args.compare_no_cold_tier:
                alone = _alone(server, model_id, script, args, interleaved=True)
        if "soak" not in skip:
            clients = 4 if args.smoke else 32
            soak, wall = timed_loop(server.base, load, clients, size.soak_s or args.soak_s)
            s = summarize(soak, wall)
            result["soak"] = {"seconds": round(wall, 1), "clients": clients, "requests": s["requests"],
                              "errors": s["errors"], "output_tok_s": s["output_tok_s"]}  # fmt: skip
        health = server.health()
        result["late_compiles"] = health.get("late_compiles")
        result["late_kernels"] = health.get("late_kernels")
        save()
    finally:
        server.stop()
    if with_tier is not None and args.compare_no_cold_tier:
        result["conversations"].update(_compare_no_cold_tier(flags, args, with_tier, alone))
    if with_tier is not None:
        result.update(conversations.headline(result["conversations"]))
        save()
    if "engine" not in skip:
        result.update(engine_alone([args.artifact, *flags], args.prompt_words, out_tokens, args.smoke))
        _ratios(result)
    result["complete"] = True
    save()
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
