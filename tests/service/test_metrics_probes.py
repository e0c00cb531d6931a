"""/metrics (Prometheus text parsed by prometheus_client), /livez vs /health, client request ids and
W3C traceparent, and the SIGTERM drain as a router sees it: readiness 503 first, new requests 503
with Retry-After while the in-flight stream finishes, then exit 0."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import requests
from conftest import API_KEY, MODEL, Server, http_responses, launch, scrape
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ninfer.service.request_id import RequestIdMiddleware
from ninfer.service.telemetry import Tracing, TracingMiddleware

NO_THINK = {"enable_thinking": False}
DRAIN_S = 20.0


def test_metrics_series_auth_and_values(server: Server) -> None:
    http0 = http_responses(server)
    assert requests.get(f"{server.url}/metrics", timeout=10).status_code == 401  # follows --api-key
    before = scrape(server.url, server.headers())
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc", "ninfer_kv_cache_retained_perc", "ninfer_cold_tier_active"):  # fmt: skip
        assert f"{name}{{}}" in before, name
    assert before["ninfer_ready{}"] == 1.0 and before["vllm:num_requests_running{}"] == 0.0
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:request_success_total"):  # fmt: skip
        assert any(k.startswith(f"{name}{{") for k in before), name  # from the first scrape on
    assert 0.0 <= before["vllm:kv_cache_usage_perc{}"] <= 1.0

    turn1 = [{"role": "system", "content": "You plan trips."}, {"role": "user", "content": "Lyon?"}]
    body = {"model": MODEL, "max_tokens": 3, "temperature": 0, **NO_THINK}
    chat = f"{server.url}/v1/chat/completions"
    first = requests.post(chat, json={**body, "messages": turn1}, headers=server.headers(), timeout=60)
    assert first.status_code == 200, first.text
    reply = first.json()["choices"][0]["message"]["content"] or ""
    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "Sunday?"}]
    second = requests.post(chat, json={**body, "messages": turn2}, headers=server.headers(), timeout=60)
    assert second.status_code == 200, second.text
    u1, u2 = first.json()["usage"], second.json()["usage"]
    cached = u1["prompt_tokens_details"]["cached_tokens"] + u2["prompt_tokens_details"]["cached_tokens"]
    assert u2["prompt_tokens_details"]["cached_tokens"] > 0

    # the counters are final once the answers are back; the gauges read the engine's snapshot,
    # taken at its next step boundary, which may come just after the client has its answer
    deadline = time.monotonic() + 10
    after = scrape(server.url, server.headers())
    while after["vllm:num_requests_running{}"] != 0.0 and time.monotonic() < deadline:
        time.sleep(0.05)
        after = scrape(server.url, server.headers())

    def delta(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    prompt = u1["prompt_tokens"] + u2["prompt_tokens"]
    for prefix in ("vllm:", "ninfer_"):
        assert delta(f"{prefix}prompt_tokens_total{{}}") == prompt
        assert delta(f"{prefix}generation_tokens_total{{}}") == 6
        assert delta(f"{prefix}prefix_cache_queries_total{{}}") == prompt
        assert delta(f"{prefix}prefix_cache_hits_total{{}}") == cached
        assert delta(f"{prefix}time_to_first_token_seconds_count{{}}") == 2
        assert delta(f"{prefix}e2e_request_latency_seconds_count{{}}") == 2
        assert delta(f"{prefix}inter_token_latency_seconds_count{{}}") == 4  # 2 gaps per request
        assert delta(f"{prefix}request_success_total{{finished_reason=length}}") == 2
    assert delta("ninfer_prefix_reuse_path_total{path=restore_turn_checkpoint}") == 1
    assert after["vllm:num_requests_running{}"] == 0.0

    bad = requests.post(chat, json={**body, "messages": turn1, "model": "nope"}, headers=server.headers())
    assert bad.status_code == 404
    assert requests.post(chat, json={**body, "messages": turn1}, timeout=10).status_code == 401
    assert requests.get(f"{server.url}/v1/nowhere", headers=server.headers(), timeout=10).status_code == 404
    http = http_responses(server) - http0
    assert http == {
        ("/v1/chat/completions", "POST", "200"): 2,
        ("/v1/chat/completions", "POST", "404"): 1,
        ("/v1/chat/completions", "POST", "401"): 1,  # refused before routing, still named
        ("unmatched", "GET", "404"): 1,
    }, http  # the 401 scrape above is a /metrics response, left out like every scrape


def test_livez_open_and_request_id_echo(server: Server) -> None:
    live = requests.get(f"{server.url}/livez", timeout=10)
    assert live.status_code == 200 and live.json() == {"status": "ok"}
    root = requests.head(server.url, timeout=10)  # Claude Code's unauthenticated connection warm-up
    assert root.status_code == 200 and not root.content
    assert requests.get(f"{server.url}/", timeout=10).json() == {"status": "ok"}
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], **NO_THINK}
    headers = {
        **server.headers(),
        "x-request-id": "router-abc-123",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }
    r = requests.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == "router-abc-123"
    named = int(r.headers["x-ninfer-request-id"])
    assert named > 0
    plain = requests.post(
        f"{server.url}/v1/chat/completions", json=body, headers=server.headers(), timeout=60
    )
    assert int(plain.headers["x-request-id"]) > 0 and "x-ninfer-request-id" not in plain.headers
    bad_id = {**server.headers(), "x-request-id": "x" * 200}  # too long: not echoed
    r = requests.post(f"{server.url}/v1/chat/completions", json=body, headers=bad_id, timeout=60)
    own = int(r.headers["x-request-id"])
    assert own > 0

    # the request log names the caller's id beside the server's own (start and done)
    ours = [e for e in server.events() if e.get("client_request_id") == "router-abc-123"]
    assert [e["event"] for e in ours] == ["request_start", "request_done"]
    assert {e["request_id"] for e in ours} == {named}
    unnamed = [e for e in server.events() if e.get("request_id") == own]
    assert unnamed and all(e["client_request_id"] is None for e in unnamed)


def test_traceparent_joins_the_callers_trace() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def app(environ: dict, start_response: object) -> list[bytes]:
        start_response("200 OK", [("x-request-id", "7")])  # type: ignore[operator]
        return [b"ok"]

    seen: list[list[tuple[str, str]]] = []
    wsgi = RequestIdMiddleware(TracingMiddleware(app, Tracing(provider)))
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/v1/messages",
        "HTTP_TRACEPARENT": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "HTTP_X_REQUEST_ID": "gw-1",
    }
    body = wsgi(environ, lambda status, headers, exc=None: seen.append(headers))
    list(body)
    body.close()  # type: ignore[attr-defined]
    (span,) = exporter.get_finished_spans()
    assert f"{span.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert span.parent is not None and f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert span.attributes["http.request.header.x-request-id"] == "gw-1"
    assert ("x-request-id", "gw-1") in seen[0] and ("x-ninfer-request-id", "7") in seen[0]


def start_open_metrics(tmp: Path, cache: Path) -> Server:
    def argv(port: int, log: Path) -> list[str]:
        return [sys.executable, "-m", "ninfer.service.cli", "--port", str(port), "--device", "cpu",
                "--max-context", "1024", "--api-key", API_KEY, "--metrics-open",
                "--request-log-jsonl", str(log), "--set", f"server.drain_timeout_s={DRAIN_S}"]  # fmt: skip

    return launch(tmp, argv, cache)


def test_sigterm_drain_readiness_first(tmp_path: Path, demo_cache: Path) -> None:
    srv = start_open_metrics(tmp_path, demo_cache)
    auth = srv.headers()
    try:
        assert requests.get(f"{srv.url}/metrics", timeout=10).status_code == 200  # --metrics-open
        chat = f"{srv.url}/v1/chat/completions"
        assert requests.post(chat, json={}, timeout=10).status_code == 401  # the API stays closed
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}], **NO_THINK}
        with requests.post(chat, json={**body, "max_tokens": 40, "stream": True}, headers=auth,
                           stream=True, timeout=60) as s:  # fmt: skip
            assert s.status_code == 200
            lines = s.iter_lines()
            next(lines)
            srv.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            health = requests.get(f"{srv.url}/health", timeout=10)
            while health.status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.05)
                health = requests.get(f"{srv.url}/health", timeout=10)
            assert health.status_code == 503 and health.json()["status"] == "draining"
            live = requests.get(f"{srv.url}/livez", timeout=10)
            assert live.status_code == 200 and live.json()["status"] == "draining"
            refused = requests.post(chat, json={**body, "max_tokens": 2}, headers=auth, timeout=10)
            assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
            assert refused.json()["error"]["code"] == "server_shutting_down"
            gauges = requests.get(f"{srv.url}/metrics", timeout=10).text
            assert "vllm:num_requests_running" in gauges
            rest = [line for line in lines if line]
        assert rest[-1] == b"data: [DONE]"
        last = json.loads(rest[-2].removeprefix(b"data: "))
        finish = last.get("choices", [{}])[0].get("finish_reason")
        assert finish == "length", rest[-3:]  # finished, not cancelled
        assert srv.proc.wait(timeout=DRAIN_S + 15) == 0
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
