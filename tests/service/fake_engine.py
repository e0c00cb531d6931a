"""A scripted stand-in for the engine (same public surface) used by the service tests until the
real engine object is available: it replies with fixed token ids and keeps page accounting."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from ninfer.engine.api import GenerationRequest, QueueTimeout, RequestStats, StepOutput
from ninfer.engine.tickets import Ticket, TicketBook
from ninfer.text.tokenizer import Tokenizer

REPLY = "Let me think.\n</think>\n\nHello from the scripted engine."
TOOL_REPLY = "\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
STEP_S = 0.01
TOTAL_PAGES = 64


@dataclass
class _Pool:
    free: int = TOTAL_PAGES


class FakeHandle:
    def __init__(
        self, engine: FakeEngine, ticket: Ticket, request: GenerationRequest, reply: list[int]
    ) -> None:
        self.engine, self.ticket, self.request, self.reply = engine, ticket, request, reply
        self.stats = RequestStats(prompt_tokens=len(request.prompt_ids))
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    def __iter__(self):
        eng = self.engine
        t0 = time.monotonic()
        if not eng.lanes.acquire(timeout=max(0.0, self.ticket.deadline - time.monotonic())):
            raise QueueTimeout("not admitted before the pending timeout")
        pages = 2
        with eng.lock:
            eng.pool.free -= pages
            eng.running += 1
        try:
            self.stats.queue_s = time.monotonic() - t0
            limit = self.request.params.max_tokens
            for i, token in enumerate(self.reply[:limit]):
                if self._cancel.is_set():
                    return
                time.sleep(eng.step_s)
                with eng.lock:
                    eng.decode_tokens += 1
                    eng.decode_rounds += 1
                text = eng.tokenizer.decode(self.reply[: i + 1])
                hit = next((s for s in self.request.params.stop if s in text), None)
                self.stats.completion_tokens = i + 1
                if hit:
                    yield StepOutput((token,), "stop", stop_string=hit)
                    return
                last = i + 1 == len(self.reply)
                if last:
                    yield StepOutput((token,), "stop", stop_token_id=token)
                    return
                yield StepOutput((token,), "length" if i + 1 == limit else None)
        finally:
            self.stats.total_s = time.monotonic() - t0
            with eng.lock:
                eng.pool.free += pages
                eng.running -= 1
            eng.lanes.release()


class FakeEngine:
    def __init__(self, settings: Any, artifact: Any) -> None:
        self.tokenizer = Tokenizer.from_file(artifact.tokenizer_path)
        e = settings.engine
        self.book = TicketBook(e.max_concurrency + e.max_pending_requests, e.pending_timeout_ms / 1000)
        self.lanes = threading.Semaphore(e.max_concurrency)
        self.lock = threading.Lock()
        self.pool = _Pool()
        self.running = 0
        self.decode_tokens = 0
        self.decode_rounds = 0
        self.ready = False
        self.step_s = STEP_S
        self.end = self.tokenizer.token_to_id("<|im_end|>")

    def start(self) -> None:
        self.ready = True

    def reserve(self) -> Ticket:
        return self.book.reserve()

    def submit(self, ticket: Ticket, request: GenerationRequest) -> FakeHandle:
        prompt = self.tokenizer.decode(list(request.prompt_ids))
        text = TOOL_REPLY if "<tools>" in prompt and "weather" in prompt.split("<tools>")[-1] else REPLY
        if not request.thinking:
            text = text.split("</think>\n\n", 1)[1]
        return FakeHandle(self, ticket, request, [*self.tokenizer.encode(text), self.end])

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {
                "running": self.running,
                "waiting": self.book.live - self.running,
                "free_pages": self.pool.free,
                "total_pages": TOTAL_PAGES,
                "live_tickets": self.book.live,
                "decode_tokens": self.decode_tokens,
                "decode_rounds": self.decode_rounds,
                "decode_row_rounds": self.decode_rounds,
            }

    def shutdown(self, drain_timeout_s: float) -> None:
        self.ready = False
