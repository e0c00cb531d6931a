"""The HTTP service on the real engine over the demo artifact, end to end: the official SDKs as
strict clients, outputs equal to the offline greedy reference, prefix reuse across turns, stop
strings, admission limits, disconnects and the request log."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest
import requests
from conftest import API_KEY, MODEL, Server
from reference import Reference, common_prefix

from ninfer.artifact.demo import demo_path

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "request-log.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
CHAT = [{"role": "user", "content": "hi"}]
NO_THINK = {"enable_thinking": False}
SPECULATIVE_KEYS = {
    "backend",
    "draft_window",
    "rounds",
    "drafted_tokens",
    "accepted_tokens",
    "fallback_steps",
    "accepted_per_position",
}


@pytest.fixture(scope="module")
def ref(demo_cache: Path) -> Reference:
    return Reference(demo_path(demo_cache))


def oa(server: Server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, _strict_response_validation=True
    )


def an(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url, api_key=API_KEY, max_retries=0, _strict_response_validation=True
    )


def post(server: Server, path: str, body: object, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(
        f"{server.url}{path}", headers={**server.headers(), **(headers or {})}, json=body, timeout=60
    )


def assert_ok_after(server: Server) -> None:
    r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 2})
    assert r.status_code == 200, r.text


def wait_event(server: Server, event: str, request_id: int, timeout_s: float = 20.0) -> dict:
    """The log line `event` of one request (streams log after their last byte is sent)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for e in server.events():
            if e["event"] == event and e.get("request_id") == request_id:
                return e
        time.sleep(0.05)
    raise AssertionError(f"no {event} for request {request_id}")


def settled(server: Server, timeout_s: float = 30.0) -> dict:
    """The scheduler state of the last throughput report once nothing is running or waiting.

    The reporter always writes the first idle interval after activity, so the last report is
    the state the engine settled in.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reports = [e["scheduler"] for e in server.events() if e["event"] == "throughput"]
        last = reports[-1] if reports else None
        if last and last["running"] == last["waiting"] == last["live_tickets"] == 0:
            return last
        time.sleep(0.1)
    raise AssertionError("the engine did not settle")


def assert_pool_restored(server: Server) -> None:
    """Every page is free again or held by an idle resident lane kept for prefix reuse."""
    start = next(e for e in server.events() if e["event"] == "server_start")["engine"]["snapshot"]
    state = settled(server)
    assert start["free_pages"] == start["total_pages"] == state["total_pages"]
    assert state["free_pages"] + state["resident_pages"] == state["total_pages"], state
    assert state["prefilling"] == state["decode_ready"] == 0


def test_health_models_and_auth(server: Server, demo_cache: Path) -> None:
    health = requests.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["late_compiles"] == 0  # nothing compiles on the CPU
    start = server.events()[0]  # `python -m ninfer.service` without an artifact serves the demo
    assert start["event"] == "server_start" and start["artifact"]["path"] == str(demo_path(demo_cache))
    r = requests.get(f"{server.url}/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = requests.get(f"{server.url}/v1/models", headers={"x-api-key": "wrong"})
    assert r.status_code == 401
    models = oa(server).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert oa(server).models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        oa(server).models.retrieve("other")
    # the Anthropic SDK (strict response validation) gets Anthropic's ModelInfo shape
    page = an(server).models.list()
    assert [(m.type, m.id, m.display_name) for m in page.data] == [("model", MODEL, MODEL)]
    assert (page.first_id, page.last_id, page.has_more) == (MODEL, MODEL, False)
    info = an(server).models.retrieve(MODEL)
    assert info.id == MODEL and info.created_at.tzinfo is not None
    with pytest.raises(anthropic.NotFoundError):
        an(server).models.retrieve("other")
    pre = requests.options(
        f"{server.url}/v1/chat/completions",
        headers={"Origin": "http://x.test", "Access-Control-Request-Method": "POST"},
    )
    assert pre.status_code == 200 and pre.headers["Access-Control-Allow-Origin"] == "*"
    r = requests.get(f"{server.url}/v1/models", headers={"x-api-key": API_KEY, "Origin": "http://x.test"})
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    assert API_KEY not in server.stderr_path.read_text()


def test_chat_create_and_stream_equal_the_reference(server: Server, ref: Reference) -> None:
    client = oa(server)
    messages = [{"role": "user", "content": "Name three colours."}]
    exp = ref.greedy(messages, 8, enable_thinking=False)
    content = exp.parse(thinking=False).content
    out = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=8, temperature=0, extra_body=NO_THINK
    )
    assert out.choices[0].message.content == (content or None)
    assert out.choices[0].finish_reason == ("stop" if exp.stopped else "length")
    assert out.usage.prompt_tokens == len(exp.prompt_ids)
    assert out.usage.completion_tokens == len(exp.ids)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=8,
            temperature=0,
            extra_body=NO_THINK,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == content
    assert chunks[-2].choices[0].finish_reason == out.choices[0].finish_reason
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == len(exp.ids)
    # the same prompt again resumes from the first request's turn checkpoint
    assert 0 < usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens == len(exp.prompt_ids)

    think = ref.greedy(messages, 8)  # the template's default: thinking on
    parse = think.parse(thinking=True)
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    msg = out.choices[0].message
    assert ((msg.model_extra or {}).get("reasoning_content"), msg.content) == (
        parse.reasoning or None,
        parse.content or None,
    )
    if "</think>" not in think.text:
        assert out.usage.completion_tokens_details.reasoning_tokens == len(think.ids) - think.stopped


def _boundary_stop(ref: Reference, ids: tuple[int, ...]) -> tuple[str, int, str]:
    """A stop string from the last character of token k-1 through the first character of token k,
    where token k's text is longer than one character (so the match ends inside token k).
    Returns (stop, k, visible text before the stop)."""
    prefixes = [ref.decode(ids[:i]) for i in range(len(ids) + 1)]
    for k in range(2, len(ids) - 1):
        before, a, b = prefixes[k - 1], prefixes[k], prefixes[k + 1]
        clean = "\ufffd" not in b and b.startswith(a) and a.startswith(before)
        if clean and len(a) > len(before) and len(b) - len(a) >= 2 and ids[k] not in ref.eos:
            stop = a[-1] + b[len(a)]
            if b.find(stop) == len(a) - 1:
                return stop, k, a[:-1]
    raise AssertionError(f"no usable token boundary in {prefixes[-1]!r}")


def test_stop_string_across_tokens(server: Server, ref: Reference) -> None:
    messages = [{"role": "user", "content": "Count slowly to ten."}]
    exp = ref.greedy(messages, 16, enable_thinking=False)
    stop, k, shown = _boundary_stop(ref, exp.ids)
    body = {"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0, "extra_body": NO_THINK}
    out = oa(server).chat.completions.create(**body, stop=[stop, "\x00never"])
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].message.content == (shown or None)
    assert out.usage.completion_tokens == k + 1  # the token that completed the stop counts
    chunks = list(oa(server).chat.completions.create(**body, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == shown
    msg = an(server).messages.create(
        model="m",
        messages=messages,
        max_tokens=16,
        extra_body={"temperature": 0},
        stop_sequences=[stop],
        thinking={"type": "disabled"},
    )
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", stop)
    assert "".join(b.text for b in msg.content if b.type == "text") == shown
    assert msg.usage.output_tokens == k + 1


def test_anthropic_sdk_and_max_tokens(server: Server, ref: Reference) -> None:
    client = an(server)
    system, user = "Be brief.", [{"role": "user", "content": "Describe the sea."}]
    messages = [{"role": "system", "content": system}, *user]
    exp = ref.greedy(messages, 6, enable_thinking=False)
    msg = client.messages.create(
        model="any-label",
        system=system,
        messages=user,
        max_tokens=6,
        extra_body={"temperature": 0},
        thinking={"type": "disabled"},
    )
    assert msg.model == "any-label"
    assert msg.stop_reason == ("end_turn" if exp.stopped else "max_tokens")
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == exp.text
    assert msg.usage.output_tokens == len(exp.ids)
    prompt = msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
    assert prompt == len(exp.prompt_ids)
    count = client.messages.count_tokens(
        model="m", system=system, messages=user, thinking={"type": "disabled"}
    )
    assert count.input_tokens == prompt
    with client.messages.stream(
        model="m",
        system=system,
        messages=user,
        max_tokens=6,
        extra_body={"temperature": 0},
        thinking={"type": "disabled"},
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    text = "".join(d.text for d in deltas if d.type == "text_delta")
    assert text == exp.text and final.usage.output_tokens == len(exp.ids)
    assert final.stop_reason == msg.stop_reason
    # the same prompt again: a prefix hit, reported alike by message_start and message_delta
    start = next(e for e in events if e.type == "message_start").message.usage
    end = next(e for e in events if e.type == "message_delta").usage
    assert start.cache_read_input_tokens > 0
    assert (start.input_tokens, start.cache_read_input_tokens) == (
        end.input_tokens,
        end.cache_read_input_tokens,
    )

    think = ref.greedy(messages, 6)
    parse = think.parse(thinking=True)
    msg = client.messages.create(
        model="m", system=system, messages=user, max_tokens=6, extra_body={"temperature": 0}
    )
    blocks = {b.type: b for b in msg.content}
    assert blocks["thinking"].thinking == parse.reasoning
    assert ("text" in blocks) == bool(parse.content)


def test_multi_turn_prefix_reuse(server: Server, ref: Reference) -> None:
    """The second turn extends the first: the engine resumes from the first turn's checkpoint and
    usage reports exactly the reused prefix; the continuation equals a from-scratch decode."""
    client = oa(server)
    turn1 = [
        {"role": "system", "content": "You plan trips."},
        {"role": "user", "content": "Plan a weekend in Lyon."},
    ]
    body = {"model": MODEL, "max_tokens": 6, "temperature": 0, "extra_body": NO_THINK}
    first = client.chat.completions.create(messages=turn1, **body)
    reply = first.choices[0].message.content or ""
    assert reply == ref.greedy(turn1, 6, enable_thinking=False).text
    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "And Sunday?"}]
    raw = client.chat.completions.with_raw_response.create(messages=turn2, **body)
    second = raw.parse()
    reused = common_prefix(
        ref.prompt_ids(turn1, enable_thinking=False), ref.prompt_ids(turn2, enable_thinking=False)
    )
    assert reused > 0
    assert second.usage.prompt_tokens_details.cached_tokens == reused
    exp = ref.greedy(turn2, 6, enable_thinking=False)
    assert second.usage.prompt_tokens == len(exp.prompt_ids)
    assert second.choices[0].message.content == (exp.text or None)
    rid = int(raw.headers["x-request-id"])
    start = wait_event(server, "request_start", rid)
    assert start["prompt_tokens"] == len(exp.prompt_ids) and start["max_tokens"] == 6
    assert start["resolved_sampling"]["temperature"] == 0.0 and isinstance(start["seed"], int)
    done = wait_event(server, "request_done", rid)
    assert done["prefix_reuse_path"] == "restore_turn_checkpoint"
    assert done["cached_tokens"] == reused
    assert done["computed_prefill_tokens"] == len(exp.prompt_ids) - reused
    assert done["completion_tokens"] == len(exp.ids)
    t = done["timings_seconds"]
    assert 0 < t["prepare"] < t["ttft"] <= t["total"] and t["decode"] > 0 and t["vision"] == 0
    assert set(done["speculative"]) == SPECULATIVE_KEYS and done["speculative"]["backend"] == "none"


def _context_case(ref: Reference) -> tuple[dict, int]:
    messages = [{"role": "user", "content": "x " * 600}]
    return {"model": MODEL, "messages": messages}, len(ref.prompt_ids(messages))


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"model": "nope", "messages": CHAT}, 404, "model_not_found", "model"),
        ({"model": MODEL, "messages": CHAT, "temperature": "hot"}, 400, "invalid_type", "temperature"),
        ({"model": MODEL, "messages": CHAT, "seed": -1}, 400, "invalid_value", "seed"),
        ({"model": MODEL, "messages": CHAT, "bogus": 1}, 400, "unknown_parameter", "bogus"),
        (
            {"model": MODEL, "messages": CHAT, "reasoning_effort": "high"},
            400,
            "reasoning_effort_not_supported",
            "reasoning_effort",
        ),
        (
            {"model": MODEL, "messages": CHAT, "reasoning_effort": "none", "enable_thinking": True},
            400,
            "conflicting_template_option",
            None,
        ),
        (
            {
                "model": MODEL,
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
                ],
            },
            400,
            "vision_disabled",
            "messages[0].content[0]",
        ),
        (None, 400, "context_length_exceeded", "messages"),
        (
            {
                "model": MODEL,
                "messages": CHAT,
                "preserve_thinking": True,
                "chat_template_kwargs": {"preserve_thinking": False},
            },
            400,
            "conflicting_template_option",
            "preserve_thinking",
        ),
    ],
)
def test_openai_errors(
    server: Server, ref: Reference, body: dict | None, status: int, code: str, param: str | None
) -> None:
    prepared = None
    if body is None:
        body, prepared = _context_case(ref)
    r = post(server, "/v1/chat/completions", body)
    err = r.json()["error"]
    assert (r.status_code, err["code"]) == (status, code), r.text
    if param is not None:
        assert err["param"] == param
    assert set(err) == {"message", "type", "param", "code"}
    if prepared is not None:  # the prepared prompt size and the configured ceiling, exactly
        assert prepared > 512
        assert f"has {prepared} tokens" in err["message"] and "at most 512 tokens" in err["message"]
        rejected = wait_event(server, "request_rejected", int(r.headers["x-request-id"]))
        assert rejected["http"]["code"] == code and rejected["phase"] == "prepare"
    assert_ok_after(server)


def test_malformed_and_oversized_bodies(server: Server) -> None:
    h = {**server.headers(), "Content-Type": "application/json"}
    r = requests.post(f"{server.url}/v1/chat/completions", data=b"{not json", headers=h)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    big = b'{"model": "' + b"x" * (1024 * 1024 + 10) + b'"}'
    r = requests.post(f"{server.url}/v1/chat/completions", data=big, headers=h)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = requests.post(
        f"{server.url}/v1/messages",
        data=iter([big[:600_000], big[600_000:]]),
        headers={**h, "x-api-key": API_KEY},
    )
    assert r.status_code == 413 and r.json() == {
        "type": "error",
        "error": {"type": "request_too_large", "message": r.json()["error"]["message"]},
    }
    assert_ok_after(server)


def _starts(server: Server) -> int:
    return sum(1 for e in server.events() if e["event"] == "request_start")


def test_admission_overload_and_queue_timeout(server: Server) -> None:
    """Two long streams fill both lanes, two more wait (filling max_pending), a fifth request is
    refused with 429 at once, the waiting two time out with 503 after pending_timeout_ms."""
    n0 = _starts(server)
    long = {"model": MODEL, "messages": [{"role": "user", "content": "Go on."}], "stream": True}
    running = []
    for _ in range(2):
        r = requests.post(
            f"{server.url}/v1/chat/completions",
            json={**long, "max_tokens": 300},
            headers=server.headers(),
            stream=True,
            timeout=60,
        )
        assert r.status_code == 200  # headers come after admission and the first token
        running.append(r)
    waiting: list[requests.Response] = []

    def wait_one() -> None:
        waiting.append(post(server, "/v1/chat/completions", {**long, "stream": False, "max_tokens": 4}))

    threads = [threading.Thread(target=wait_one) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while _starts(server) < n0 + 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    over = post(server, "/v1/chat/completions", {**long, "stream": False})
    over_an = post(
        server, "/v1/messages", {"model": "m", "max_tokens": 4, "messages": CHAT}, {"x-api-key": API_KEY}
    )
    # a template-option error is the request's own 400 even with no capacity left
    bad_option = post(
        server,
        "/v1/chat/completions",
        {**long, "stream": False, "chat_template_kwargs": {"enable_thinking": "yes"}},
    )
    for t in threads:
        t.join(30)
    for r in running:
        r.close()
    assert (over.status_code, over.json()["error"]["code"]) == (429, "server_overloaded"), over.text
    assert over_an.status_code == 429 and over_an.json()["error"]["type"] == "rate_limit_error"
    assert (bad_option.status_code, bad_option.json()["error"]["code"]) == (400, "invalid_template_option")
    assert [(r.status_code, r.json()["error"]["code"]) for r in waiting] == [
        (503, "request_queue_timeout")
    ] * 2
    assert [r.headers.get("Retry-After") for r in (over, over_an, *waiting)] == ["1"] * 4
    assert "Retry-After" not in bad_option.headers
    rejected = wait_event(server, "request_rejected", int(over.headers["x-request-id"]))
    assert rejected["http"]["status"] == 429
    for r in waiting:
        error = wait_event(server, "request_error", int(r.headers["x-request-id"]))
        assert error["http"]["status"] == 503 and error["http"]["code"] == "request_queue_timeout"
    for r in running:
        done = wait_event(server, "request_done", int(r.headers["x-request-id"]))
        assert done["finish_reason"] == "cancelled" and 0 < done["completion_tokens"] < 300
    assert_pool_restored(server)
    assert_ok_after(server)


def _raw_stream(server: Server, max_tokens: int) -> tuple[socket.socket, int]:
    """Send a streaming request on a raw socket; return it with the request id once headers arrive."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"model": MODEL, "messages": CHAT, "stream": True, "max_tokens": max_tokens}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    headers = data.split(b"\r\n\r\n")[0].decode().lower().splitlines()
    assert headers[0].endswith("200 ok"), headers
    rid = next(int(h.split(":")[1]) for h in headers if h.startswith("x-request-id:"))
    return sock, rid


def test_disconnect_cancels(server: Server) -> None:
    sock, rid = _raw_stream(server, 300)
    sock.close()
    done = wait_event(server, "request_done", rid)
    assert done["finish_reason"] == "cancelled" and done["completion_tokens"] < 300
    assert done["timings_seconds"]["total"] > done["timings_seconds"]["prepare"]
    assert_pool_restored(server)


def _stream_client(server: Server, disconnect: bool, results: list, i: int) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"client {i}"}],
        "stream": True,
        "max_tokens": 12,
    }
    try:
        with requests.post(
            f"{server.url}/v1/chat/completions", json=body, headers=server.headers(), stream=True, timeout=60
        ) as r:
            rid = int(r.headers["x-request-id"]) if "x-request-id" in r.headers else None
            if r.status_code != 200:
                results.append((r.status_code, r.json()["error"]["code"], rid))
                return
            lines = r.iter_lines()
            if disconnect:
                next(lines)
                next(lines)
                results.append((200, "disconnected", rid))
                return
            text = b"\n".join(lines)
            ok = text.rstrip().endswith(b"data: [DONE]") and b'"error"' not in text
            results.append((200, "done" if ok else text.decode()[-300:], rid))
    except requests.RequestException as exc:
        results.append((0, repr(exc), None))


def test_bounded_concurrency_and_disconnects(server: Server) -> None:
    n = 3 * (2 + 2)  # 3 x (max_concurrency + max_pending_requests)
    results: list = []
    threads = [
        threading.Thread(target=_stream_client, args=(server, i % 3 == 0, results, i)) for i in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert len(results) == n, results
    outcomes = {(status, code) for status, code, _ in results}
    allowed = {
        (200, "done"),
        (200, "disconnected"),
        (429, "server_overloaded"),
        (503, "request_queue_timeout"),
    }
    assert outcomes <= allowed, results
    assert (200, "done") in outcomes and (429, "server_overloaded") in outcomes
    expected_log = {
        (200, "done"): ("request_done", {"length", "stop"}),
        (200, "disconnected"): ("request_done", {"cancelled", "length", "stop"}),
        (429, "server_overloaded"): ("request_rejected", None),
        (503, "request_queue_timeout"): ("request_error", None),
    }
    for status, code, rid in results:
        assert rid is not None
        event, finishes = expected_log[(status, code)]
        line = wait_event(server, event, rid)
        if finishes is not None:
            assert line["finish_reason"] in finishes
        else:
            assert (line["http"]["status"], line["http"]["code"]) == (status, code)
    assert_pool_restored(server)


def test_request_log_schema_and_pairing(server: Server) -> None:
    settled(server)
    events = server.events()
    for event in events:
        VALIDATOR.validate(event)
    assert events[0]["event"] == "server_start" and API_KEY not in json.dumps(events)
    assert len({e["server_instance_id"] for e in events}) == 1
    started = [e["request_id"] for e in events if e["event"] == "request_start"]
    ended = [e["request_id"] for e in events if e["event"] in ("request_done", "request_error")]
    rejected = [e["request_id"] for e in events if e["event"] == "request_rejected"]
    assert sorted(started) == sorted(ended)
    assert not set(rejected) & set(started)
    ids = sorted(started + rejected)
    assert ids == sorted(set(ids))
    done = [e for e in events if e["event"] == "request_done"]
    reports = [e for e in events if e["event"] == "throughput"]
    # every prompt token the engine computed shows up in exactly one interval
    assert sum(e["prefill_tokens"] for e in reports) == sum(e["computed_prefill_tokens"] for e in done)
    assert sum(e["decode_rounds"] for e in reports) > 0
    assert all(set(e["speculative"]) == SPECULATIVE_KEYS for e in done)
