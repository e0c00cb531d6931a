"""Property-based fuzzing of every POST endpoint in-process: valid bodies mutated field by field.

Each example takes a valid body of one route and applies a few mutations (a value replaced by a
hostile one, a key dropped or added, deep nesting spliced in, the bytes truncated or corrupted);
hostile values are wrong types, odd Unicode (lone surrogates, NUL, non-characters) and odd numbers
(huge integers, -0.0, 1e308, NaN and Infinity as Python's JSON spells them). Whatever the body,
the answer is never a 5xx; a 4xx is JSON in the route's error envelope; a 2xx is standard JSON
(or an SSE stream of it) without an in-band server failure; and no parser defect or unhandled
error is logged.

The app runs in-process over the scripted engine behind the real engine's submission checks
(`intake.validate_request`) and one real sampling step, so a request the protocol layer accepts but the
engine would refuse is caught too, while generation stays cheap (a short scripted reply).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import falcon.testing
import pytest
import torch
from fake_engine import FakeEngine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer.api.context import ApiContext, ServedModel
from ninfer.api.json_body import MAX_DEPTH
from ninfer.api.pipeline import Pipeline
from ninfer.api.prompting import FrontendPrompts
from ninfer.artifact import ensure_demo_artifact, open_artifact
from ninfer.config import load_settings
from ninfer.engine.intake import validate_request
from ninfer.engine.sampler import RowSampler, sample_rows
from ninfer.engine.tickets import Ticket
from ninfer.engine.types import GenerationRequest
from ninfer.frontend.options import ServerDefaults
from ninfer.service.app import create_app
from ninfer.service.console import LOGGER_NAME
from ninfer.text.tokenizer import Tokenizer

MODEL = "ninfer-demo"
# Per route; five routes stay well under a minute on two loaded cores. NINFER_FUZZ_EXAMPLES runs
# a longer search on demand.
EXAMPLES = int(os.environ.get("NINFER_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=timedelta(seconds=10),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CALL_ARGS = json.dumps({"city": "Paris"})
BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": CALL_ARGS},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "get_weather", "description": "d", "parameters": WEATHER},
            }
        ],
        "tool_choice": "auto",
        "max_tokens": 2,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.0,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.1,
        "seed": 3,
        "stop": ["\n\n"],
        "stream": False,
        "enable_thinking": False,
    },
    "/v1/responses": {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": CALL_ARGS},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
        "tools": [{"type": "function", "name": "get_weather", "description": "d", "parameters": WEATHER}],
        "max_output_tokens": 16,
        "temperature": 0.7,
        "top_p": 0.9,
        "metadata": {"k": "v"},
        "reasoning": {"effort": "none"},
        "store": False,
        "stream": False,
    },
    "/v1/responses/input_tokens": {
        "model": MODEL,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    },
    "/v1/messages": {
        "model": MODEL,
        "max_tokens": 2,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
        ],
        "tools": [{"name": "get_weather", "description": "d", "input_schema": WEATHER}],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        "stop_sequences": ["\n\n"],
        "thinking": {"type": "disabled"},
        "stream": False,
    },
    "/v1/messages/count_tokens": {
        "model": MODEL,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Count this."}],
        "tools": [{"name": "get_weather", "input_schema": WEATHER}],
    },
}
ROUTES = list(BASES)
KNOWN_KEYS = sorted({key for body in BASES.values() for key in body} | {"n", "user", "stream_options"})

# ----- hostile values -----
SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
SPECIALS = st.sampled_from(
    ["\x00", "\x1f", "\ufffe", "\uffff", "\ufdd0", "\U0010ffff", "\u202e", "\ufeff", '"', "\\"]
)
PLAIN_TEXT = st.text(st.one_of(st.characters(exclude_categories=["Cs"]), SPECIALS), max_size=10)
ODD_TEXT = st.one_of(
    PLAIN_TEXT, PLAIN_TEXT, st.text(st.one_of(SURROGATES, SPECIALS, st.characters()), max_size=10)
)
ODD_NUMBERS = st.one_of(
    st.integers(),
    st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**30, -1, 0, 1, 2, 16]),
    st.floats(),  # NaN, +-Infinity and -0.0 included
    st.sampled_from([-0.0, 1e308, -1e308, 5e-324, 1e-40, float("nan"), float("inf"), float("-inf"), 0.5]),
)
LEAVES = st.one_of(st.none(), st.booleans(), ODD_NUMBERS, ODD_TEXT)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ODD_TEXT, inner, max_size=3),
    max_leaves=8,
)
# Deep nesting cannot be built as a Python value (encoding it would recurse): a marker string is
# placed instead and replaced by the nested text after encoding.
DEEP = st.tuples(st.integers(MAX_DEPTH - 4, 100_000), st.sampled_from("[{")).map(
    lambda d: f"\x01deep:{d[0]}:{d[1]}\x01"
)
_DEEP_MARK = re.compile(r'"\\u0001deep:(\d+):([\[{])\\u0001"')


def _deep_text(match: re.Match[str]) -> str:
    n = int(match.group(1))
    return "[" * n + "]" * n if match.group(2) == "[" else '{"a": ' * n + "0" + "}" * n


def encode(body: Any, ascii_only: bool) -> bytes:
    """Python's JSON spelling (NaN / Infinity as it writes them); without `ascii_only` a lone
    surrogate goes out as its raw (invalid UTF-8) bytes."""
    text = json.dumps(body, ensure_ascii=ascii_only, allow_nan=True)
    return _DEEP_MARK.sub(_deep_text, text).encode("utf-8", "surrogatepass")


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every location in a JSON value, the root included."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from paths(item, (*prefix, i))


def at(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


def same_kind(value: Any) -> st.SearchStrategy[Any]:
    """A plausible replacement of a leaf's own type, so field-level rules (ranges, enums,
    lengths) are exercised as well as type checks."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(-3, 40) | ODD_NUMBERS
    if isinstance(value, float):
        return st.floats(-3, 3) | ODD_NUMBERS
    if isinstance(value, str):
        return st.sampled_from(["", "x", "auto", "none", "function", "text", "user", MODEL]) | PLAIN_TEXT
    return VALUES


@st.composite
def mutated(draw: st.DrawFn, route: str) -> bytes:
    """A valid body of `route` after one to three mutations, as the bytes a client would send."""
    body: Any = json.loads(json.dumps(BASES[route]))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["tweak", "tweak", "replace", "replace", "drop", "add", "rename", "deep"]))
        places = list(paths(body))
        path = draw(st.sampled_from(places))
        if op in ("tweak", "replace", "deep"):
            kinds = {"tweak": same_kind(at(body, path)), "replace": VALUES, "deep": DEEP}
            new = draw(kinds[op])
            if not path:
                body = new
            else:
                at(body, path[:-1])[path[-1]] = new
            continue
        target = at(body, path[:-1]) if path else None
        if op == "drop" and isinstance(target, dict | list):
            del target[path[-1]]
        elif op == "add" and isinstance(at(body, path), dict):
            key = draw(st.sampled_from(KNOWN_KEYS) | ODD_TEXT)
            at(body, path)[key] = draw(VALUES)
        elif op == "rename" and isinstance(target, dict):
            target[draw(ODD_TEXT)] = target.pop(path[-1])
    raw = encode(body, ascii_only=draw(st.booleans()))
    cut = draw(st.sampled_from(["none"] * 8 + ["truncate", "insert"]))
    if cut == "truncate":
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    elif cut == "insert":
        i = draw(st.integers(0, len(raw)))
        raw = (
            raw[:i]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"]", b"{"]))
            + raw[i:]
        )
    return raw


# ----- the app -----
class CheckedEngine(FakeEngine):
    """The scripted engine behind the real engine's submission checks and one real sampling
    step on fixed logits: what the engine would refuse or fail to sample fails here too."""

    def __init__(self, settings: Any, artifact: Any) -> None:
        super().__init__(settings, artifact)
        self.step_s = 0.0
        self.vocab_size = artifact.config.vocab_size
        self.logits = 30 * torch.randn(1, self.vocab_size, generator=torch.Generator().manual_seed(0))

    def submit(self, ticket: Ticket, request: GenerationRequest) -> Any:
        intake = validate_request(
            request,
            ticket,
            time.monotonic(),
            config=self.config,
            vocab_size=self.vocab_size,
            has_media=False,
            default_stop_ids=frozenset(),
            detokenizer_factory=None,
            spec=None,
        )
        sample_rows(self.logits, [RowSampler(intake.sampling)])
        return super().submit(ticket, request)


class NullObserver:
    def rejected(self, *args: Any) -> None: ...
    def started(self, *args: Any) -> None: ...
    def done(self, *args: Any) -> None: ...
    def failed(self, *args: Any) -> None: ...


class Faults(logging.Handler):
    """Error records of the `ninfer` loggers: parser defects, unhandled errors, failed streams."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def app() -> Iterator[tuple[falcon.testing.TestClient, Faults]]:
    config = load_settings(
        ["engine.max_context=512", "engine.default_max_tokens=2", "engine.max_pending_requests=4"]
    )
    artifact = open_artifact(ensure_demo_artifact())
    engine = CheckedEngine(config, artifact)
    prompts = FrontendPrompts(
        artifact.chat_template, Tokenizer.from_file(artifact.tokenizer_path), ServerDefaults()
    )
    ids = itertools.count(1)
    pipeline = Pipeline(engine, prompts, NullObserver(), lambda: next(ids))
    ctx = ApiContext()
    ctx.serve(ServedModel(MODEL, 512, prompts.caps.efforts), pipeline)
    client = falcon.testing.TestClient(
        create_app(ctx, lambda: (200, {"status": "ok"}), api_key=None, cors=False, max_request_bytes=1 << 20)
    )
    faults = Faults()
    log = logging.getLogger(LOGGER_NAME)
    log.addHandler(faults)
    yield client, faults
    log.removeHandler(faults)


# ----- the properties -----
def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in an answer is not JSON")

    return json.loads(text, parse_constant=refuse)


def assert_error_envelope(route: str, body: Any) -> None:
    if route.startswith("/v1/messages"):
        assert isinstance(body, dict) and set(body) == {"type", "error"} and body["type"] == "error"
        err = body["error"]
        assert set(err) == {"type", "message"} and isinstance(err["message"], str) and err["message"]
        assert err["type"] in ("invalid_request_error", "not_found_error", "request_too_large")
        return
    assert isinstance(body, dict) and set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["code"], str)
    assert err["type"] == "invalid_request_error" and (err["param"] is None or isinstance(err["param"], str))


def assert_stream(route: str, text: str) -> None:
    """Every SSE data line is standard JSON or [DONE], and no frame reports a server failure."""
    frames = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert frames, text[:500]
    for data in frames:
        if data == "[DONE]":
            continue
        event = _strict_json(data)
        assert not (isinstance(event.get("error"), dict) and route.startswith("/v1/chat")), event
        assert event.get("type") not in ("error", "response.failed"), event


def check(route: str, result: falcon.testing.Result, faults: Faults, sent: bytes) -> None:
    context = f"{route} {sent[:300]!r} -> {result.status_code} {result.text[:500]}"
    assert result.status_code < 500, context
    assert not faults.records, f"{context}\nlogged: {faults.records[0].getMessage()}"
    if result.status_code >= 400:
        assert result.headers["content-type"].startswith("application/json"), context
        assert_error_envelope(route, _strict_json(result.text))
    elif result.headers.get("content-type", "").startswith("text/event-stream"):
        assert_stream(route, result.text)
    else:
        assert isinstance(_strict_json(result.text), dict), context


def test_every_base_body_is_answered(app: tuple[falcon.testing.TestClient, Faults]) -> None:
    """The mutations start from bodies each route answers with a 200."""
    client, faults = app
    for route, body in BASES.items():
        r = client.simulate_post(route, body=encode(body, ascii_only=True), content_type="application/json")
        assert r.status_code == 200, (route, r.text)
        check(route, r, faults, b"")


@pytest.mark.parametrize("route", ROUTES)
def test_mutated_bodies_never_fault(app: tuple[falcon.testing.TestClient, Faults], route: str) -> None:
    client, faults = app

    @FUZZ
    @given(raw=mutated(route))
    def run(raw: bytes) -> None:
        faults.records.clear()
        result = client.simulate_post(route, body=raw, content_type="application/json")
        check(route, result, faults, raw)

    run()
