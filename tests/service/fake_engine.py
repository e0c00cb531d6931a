"""A scripted engine with the real engine's public surface, for tests that need exact output tokens.

The token ids are scripted (a reasoning/answer split; a tool call when a weather tool is offered,
and the plain answer once the last turn holds a tool result, so an agent loop ends after one call);
everything after the ids is the real engine's code: `StopChecker` over the artifact tokenizer's
`IncrementalDetokenizer` produces `StepOutput.text`, so stop strings are matched and withheld
exactly as in `Engine`.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import falcon.testing

from ninfer.api.context import ApiContext, ServedModel
from ninfer.api.pipeline import Pipeline
from ninfer.api.prompting import FrontendPrompts
from ninfer.artifact import ensure_demo_artifact, open_artifact
from ninfer.bootstrap import engine_config
from ninfer.config import load_settings
from ninfer.engine.counters import Counters
from ninfer.engine.grammar import GrammarUnavailable
from ninfer.engine.handle import RequestHandle
from ninfer.engine.scheduler import Snapshot
from ninfer.engine.stops import StopChecker
from ninfer.engine.tickets import Ticket, TicketBook
from ninfer.engine.types import (
    ConstraintSpec,
    ContextLengthExceeded,
    GenerationRequest,
    QueueTimeout,
    RequestStats,
    StepOutput,
)
from ninfer.frontend.options import ServerDefaults
from ninfer.service.app import create_app
from ninfer.text.detok import IncrementalDetokenizer
from ninfer.text.tokenizer import Tokenizer

REPLY = "Let me think.\n</think>\n\nHello from the scripted engine."
TOOL_REPLY = (
    "\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>"
)
STEP_S = 0.01


def script(tokenizer: Tokenizer, prompt: str, thinking: bool) -> list[int]:
    """The scripted reply ids (ending with <|im_end|>) for a rendered prompt."""
    tools = "<tools>" in prompt and "weather" in prompt.split("<tools>")[-1]
    answered = "<tool_response>" in prompt.rsplit("<|im_start|>user", 1)[-1]
    text = TOOL_REPLY if tools and not answered else REPLY
    if not thinking:
        text = text.split("</think>\n\n", 1)[1]
    return [*tokenizer.encode(text), tokenizer.token_to_id("<|im_end|>")]


class ScriptRun:
    """One request: a thread that waits for a lane, then puts the scripted outputs into the
    engine's own `RequestHandle` (so iteration, cancellation and `finished` behave as in `Engine`)."""

    def __init__(self, engine: FakeEngine, ticket: Ticket, request: GenerationRequest) -> None:
        self.engine, self.ticket, self.request = engine, ticket, request
        prompt = engine.tokenizer.decode(list(request.prompt_ids))
        self.reply = script(engine.tokenizer, prompt, request.thinking)
        # the entitlement as the engine's intake resolves it: the default within the context left
        ctx, n = engine.config.max_context, len(request.prompt_ids)
        if n + 1 > ctx:
            raise ContextLengthExceeded(n, ctx)
        wanted = request.params.max_tokens
        self.limit = min(engine.config.default_max_tokens if wanted is None else wanted, ctx - n)
        stats = RequestStats(prompt_tokens=n, max_tokens=self.limit)
        end = frozenset({self.reply[-1]})
        self.stops = StopChecker(end, request.params.stop, IncrementalDetokenizer(engine.tokenizer))
        self.cancelled = threading.Event()
        self.handle = RequestHandle(request.request_id, ticket, stats, self.cancelled.set)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        eng, stats, t0 = self.engine, self.handle.stats, time.monotonic()
        if not eng.lanes.acquire(timeout=max(0.0, self.ticket.deadline - t0)):
            self.handle._put(QueueTimeout("not admitted before the pending timeout"))
            return
        with eng.lock:
            eng.running += 1
        try:
            stats.queue_s = time.monotonic() - t0
            self._generate()
        finally:
            stats.total_s = time.monotonic() - t0
            with eng.lock:
                eng.running -= 1
            eng.lanes.release()

    def _generate(self) -> None:
        limit = self.limit
        for i, token in enumerate(self.reply):
            if self.cancelled.is_set():
                self.handle._put(StepOutput((), "cancelled"))
                return
            time.sleep(self.engine.step_s)
            self.engine.counters.add(decode_tokens=1, decode_rounds=1, decode_row_rounds=1)
            self.handle.stats.completion_tokens = i + 1
            text, hit = self.stops.push(token)
            if hit is not None:
                self.handle._put(StepOutput((token,), "stop", hit.string, hit.token_id, text=text))
                return
            if i + 1 == limit:
                tail = self.stops.flush() or ""
                self.handle._put(StepOutput((token,), "length", text=(text or "") + tail))
                return
            self.handle._put(StepOutput((token,), text=text))


class FakeEngine:
    def __init__(self, settings: Any, artifact: Any) -> None:
        self.tokenizer = Tokenizer.from_file(artifact.tokenizer_path)
        self.config = engine_config(settings, artifact, "cpu", "float32")
        e = settings.engine
        self.tickets = TicketBook(e.max_concurrency + e.max_pending_requests, e.pending_timeout_ms / 1000)
        self.lanes = threading.Semaphore(e.max_concurrency)
        self.lock = threading.Lock()
        self.counters = Counters()
        self.ledger = None  # no KV pool
        self.error: str | None = None
        self.running = 0
        self.step_s = STEP_S

    def start(self) -> FakeEngine:
        return self

    def reserve(self) -> Ticket:
        return self.tickets.reserve()

    def submit(self, ticket: Ticket, request: GenerationRequest) -> RequestHandle:
        return ScriptRun(self, ticket, request).handle

    def snapshot(self) -> Snapshot:
        """The scripted engine's occupancy: it holds no KV pages."""
        with self.lock:
            running = self.running
        return Snapshot(
            running=running,
            prefilling=0,
            decode_ready=running,
            waiting=0,
            free_pages=1,
            total_pages=1,
            idle_lanes=0,
            resident_lanes=0,
            resident_pages=0,
        )

    def wait_ready(self, timeout: float | None = None) -> bool:
        return True

    def check_constraint(self, spec: ConstraintSpec) -> None:
        raise GrammarUnavailable(spec.param, "constrained output needs an engine with a tokenizer")

    def graph_stats(self) -> None:
        return None

    def cold_tier_stats(self) -> None:
        return None

    def late_compiles(self) -> int:
        return 0

    def late_kernels(self) -> dict[str, int]:
        return {}

    def shutdown(self, drain_timeout_s: float) -> None:
        pass


def scripted_app(
    overrides: list[str], observer: Any, model: str, response_store: Any = None
) -> tuple[falcon.testing.TestClient, FakeEngine]:
    """The service's Falcon app on the demo artifact's tokenizer and template, over a scripted
    engine (no step delay), `observer`'s request reports and, if given, `response_store`."""
    settings = load_settings(overrides)
    artifact = open_artifact(ensure_demo_artifact())
    engine = FakeEngine(settings, artifact)
    engine.step_s = 0.0
    prompts = FrontendPrompts(
        artifact.chat_template, Tokenizer.from_file(artifact.tokenizer_path), ServerDefaults()
    )
    ids = itertools.count(1)
    ctx = ApiContext()
    served = ServedModel(model, settings.engine.max_context, prompts.caps.efforts)
    ctx.serve(served, Pipeline(engine, prompts, observer, lambda: next(ids)))
    if response_store is not None:
        ctx.response_store = response_store  # type: ignore[attr-defined]
    app = create_app(
        ctx, lambda: (200, {"status": "ok"}), api_key=None, cors=False, max_request_bytes=1 << 20
    )
    return falcon.testing.TestClient(app), engine
