"""The protocol-independent generation path: ticket -> prepare -> context check -> submit -> events."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ninfer.api.errors import ApiError, internal, invalid, unsupported
from ninfer.api.events import Event, Finished, FinishKind, GenerationJob, LogprobsDelta, Usage
from ninfer.api.ports import EnginePort, Handle, Observer, OutputDecoder, Prepared, PromptPort
from ninfer.engine.grammar import GrammarError, GrammarUnavailable
from ninfer.engine.tickets import Ticket
from ninfer.engine.types import (
    ContextLengthExceeded,
    EngineError,
    EngineOverloaded,
    EngineStopped,
    GenerationRequest,
    QueueTimeout,
    RequestStats,
    StepOutput,
    TokenLogprob,
)
from ninfer.frontend.parser import ParseResult

CANCEL_WAIT_S = 10.0  # bound on waiting for the engine to acknowledge a cancellation
WATCH_S = 0.2  # how often a request waiting on the engine checks that its client is still there

ClientProbe = Callable[[], bool]  # True once the client has closed its connection


@dataclass(frozen=True)
class Caller:
    """What the HTTP layer knows of the request's sender."""

    client_gone: ClientProbe | None = None  # None off gunicorn (e.g. in tests)
    request_id: str | None = None  # the client's (a router's) valid `x-request-id`, for the logs


class ClientDisconnected(ApiError):
    """The client went away while its request waited on the engine; the request is cancelled
    (reported as finished `cancelled`, like a stream whose client disconnected)."""

    def __init__(self) -> None:
        super().__init__(499, "client_disconnected", "the client closed the connection before the answer")


def context_error(prompt_tokens: int, max_context: int) -> ApiError:
    return ApiError(
        400,
        "context_length_exceeded",
        f"the prepared prompt has {prompt_tokens} tokens; this server allows at most "
        f"{max_context} tokens of prompt plus output (max_context={max_context})",
        "messages",
    )


def engine_error(exc: BaseException) -> ApiError:
    """Map an engine exception to the contract's HTTP error."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, GrammarError):
        return invalid(exc.param, exc.message)
    if isinstance(exc, EngineOverloaded):
        return ApiError(429, "server_overloaded", "the server is at capacity; retry later", retryable=True)
    if isinstance(exc, QueueTimeout):
        return ApiError(
            503, "request_queue_timeout", "the request was not admitted before the pending timeout"
        )
    if isinstance(exc, ContextLengthExceeded):
        return context_error(exc.prompt_tokens, exc.max_context)
    if isinstance(exc, EngineStopped):
        return ApiError(
            503, "server_shutting_down", "the server is shutting down and accepts no new requests"
        )
    if isinstance(exc, EngineError):
        return internal(f"generation failed: {exc}")
    return internal(f"internal error: {type(exc).__name__}: {exc}")


class Pipeline:
    """Runs one generation per call to `open`; protocol adapters only translate shapes."""

    def __init__(
        self,
        engine: EnginePort,
        prompts: PromptPort,
        observer: Observer,
        next_id: Callable[[], int],
    ) -> None:
        self.engine = engine
        self.prompts = prompts
        self.observer = observer
        self._next_id = next_id

    def _check_constraint(self, job: GenerationJob) -> GenerationJob:
        """Compile the job's grammar; an engine that cannot constrain drops a constraint the
        request allows to fall back (`constraint_fallback`, recorded) and refuses any other. The
        parts (a tool's input grammar, the text format) compile only when the whole fails, to name
        the field at fault: on success each grammar compiles once."""
        assert job.constraint is not None
        try:
            try:
                self.engine.check_constraint(job.constraint)
            except GrammarUnavailable:
                raise
            except GrammarError:
                for spec in job.constraint_parts:  # the first part at fault names its field
                    self.engine.check_constraint(spec)
                raise
        except GrammarUnavailable as exc:
            if job.constraint_fallback is None:
                raise unsupported(exc.param, exc.message) from None
            note = {"param": job.constraint.param, "action": "mapped", "detail": job.constraint_fallback}
            return replace(job, constraint=None, constraint_parts=(), compat=[*job.compat, note])
        return job

    def count_tokens(self, job: GenerationJob) -> int:
        """Prompt tokens of a job without generating (not a measurement request)."""
        prepared = self.prompts.prepare(job.conversation, job.controls, bool(job.shape.get("tools")))
        prepared.release_media()  # counting needs only the grids
        return len(prepared.token_ids)

    def open(self, job: GenerationJob, caller: Caller | None = None) -> Generation:
        """Reserve, prepare and submit; raise ApiError (with an HTTP status) on any synchronous failure.

        Returns once the first engine output is available, so admission failures still get a
        real status code instead of an in-band stream error. With `client_gone`, every wait on the
        engine checks the client every WATCH_S and cancels the request once it has gone.
        """
        caller = caller or Caller()
        if caller.request_id is not None:
            job = replace(job, client_request_id=caller.request_id)
        request_id = self._next_id()
        t0 = time.monotonic()
        tools = bool(job.shape.get("tools"))
        ticket: Ticket | None = None
        prepared: Prepared | None = None
        handle: Handle | None = None
        try:
            self.prompts.check_options(job.controls)  # a 400 of its own, not a 429 under load
            if job.constraint is not None:  # compiled (cached) before admission: a bad schema is a 400
                job = self._check_constraint(job)
            ticket = self.engine.reserve()
            # media preparation shares the request's admission deadline
            if job.raw_prompt is not None:  # legacy completions: no template, plain text out
                prepared = Prepared(job.raw_prompt, thinking=False, preserve_thinking=False, effort=None)
            else:
                prepared = self.prompts.prepare(job.conversation, job.controls, tools, ticket.deadline)
            # the engine resolves the entitlement (the default, within the context left) and
            # refuses a prompt that leaves no room (ContextLengthExceeded -> context_error)
            params = replace(job.params, max_tokens=job.params.max_tokens if job.max_tokens_given else None)
            request = GenerationRequest(
                request_id=str(request_id),
                prompt_ids=prepared.token_ids,
                params=params,
                thinking=prepared.thinking,
                turn_checkpoint=prepared.turn_checkpoint,
                response_checkpoint=prepared.response_checkpoint,
                multimodal=prepared.multimodal,
                constraint=job.constraint,
            )
            decoder = self.prompts.decoder(prepared, job.conversation.tools)
            handle = self.engine.submit(ticket, request)
        except Exception as exc:
            if prepared is not None and handle is None:
                prepared.release_media()  # the engine never took the payloads
            error = engine_error(exc)
            error.request_id = request_id
            try:  # logged while the ticket is live: a throughput report after release follows the log
                self.observer.rejected(request_id, job, error, time.monotonic() - t0)
            finally:
                if ticket is not None:
                    ticket.release()
            raise error from exc
        self.observer.started(request_id, job, prepared, request, handle.stats)
        gen = Generation(request_id, job, prepared, handle, ticket, decoder, self, caller.client_gone)
        gen.prepare_s = time.monotonic() - t0
        gen.prime()
        return gen


class Generation:
    """One submitted request. Iterate `events()`; always `close()` (it cancels if unfinished)."""

    def __init__(
        self,
        request_id: int,
        job: GenerationJob,
        prepared: Prepared,
        handle: Handle,
        ticket: Ticket,
        decoder: OutputDecoder,
        pipeline: Pipeline,
        client_gone: ClientProbe | None = None,
    ) -> None:
        self.request_id = request_id
        self.job = job
        self.prepared = prepared
        self.prompt_tokens = len(prepared.token_ids)
        self.prepare_s = 0.0
        self._handle = handle
        self._ticket = ticket
        self._decoder = decoder
        self._pipeline = pipeline
        self._client_gone = client_gone
        self._probe_at = 0.0  # monotonic time of the next client probe
        self._outputs: Iterator[StepOutput] = iter(handle)
        self._first: StepOutput | None = None
        self._completion_ids: list[int] = []
        self._finished: Finished | None = None
        self._error: ApiError | None = None
        self._engine_finish: str | None = None
        self._closed = False
        self._logprobs: list[dict[str, Any]] = []
        # with prompt logprobs requested: set by `prime` (the engine sends them on the first output)
        self.prompt_logprobs: tuple[dict[str, Any] | None, ...] | None = None
        self._stop_lp: dict[str, Any] | None = None  # the entry of the stop token that ended the answer

    def prime(self) -> None:
        """Wait for the first output; on failure close the request and raise its HTTP error."""
        try:
            self._first = self._next()
            scored = self._first.prompt_logprobs
            if scored is not None:
                self.prompt_logprobs = tuple(None if lp is None else self._lp_entry(lp) for lp in scored)
        except StopIteration:
            self._first = StepOutput((), "error", error="engine ended the request without output")
        except ClientDisconnected:
            self.close()
            raise
        except BaseException as exc:
            self._error = engine_error(exc)
            self._error.request_id = self.request_id
            self.close()
            raise self._error from exc

    def _next(self) -> StepOutput:
        """The next engine output (StopIteration after the last); raises ClientDisconnected once
        the client is gone. The client is probed every WATCH_S whether or not outputs keep
        arriving (a fast decode never leaves the queue empty for that long)."""
        if self._client_gone is None:
            return next(self._outputs)
        while True:
            now = time.monotonic()
            if now >= self._probe_at:
                self._probe_at = now + WATCH_S
                if self._client_gone():
                    raise ClientDisconnected()
            self._handle.timeout_s = WATCH_S
            try:
                return next(iter(self._handle))  # every iter() continues where the last one stopped
            except queue.Empty:
                continue

    def _steps(self) -> Iterator[StepOutput]:
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        while not self._handle.finished:
            yield self._next()

    def events(self) -> Iterator[Event]:
        """Parsed events in order, ending with one `Finished`; raises ApiError on a generation failure."""
        try:
            yield from self._run()
        except (GeneratorExit, ClientDisconnected):
            raise
        except BaseException as exc:
            self._error = engine_error(exc)
            raise self._error from exc

    def collect(self) -> Finished:
        """Drain the events for a non-streaming answer (the caller still closes)."""
        for event in self.events():
            if isinstance(event, Finished):
                return event
        raise internal("generation ended without a final event")

    def _run(self) -> Iterator[Event]:
        finish: StepOutput | None = None
        for out in self._steps():
            self._completion_ids.extend(out.token_ids)  # every accepted id, a stop token included
            if out.finish_reason not in ("cancelled", "error"):  # those carry no visible text
                if out.logprobs:
                    self._stop_lp = next(
                        (self._lp_entry(lp) for lp in out.logprobs if lp.token_id == out.stop_token_id), None
                    )
                    entries = self._logprob_entries(out)
                    if entries:
                        self._logprobs.extend(entries)
                        yield LogprobsDelta(entries)
                yield from self._decoder.feed(out)
            if out.finish_reason is not None:
                finish = out
                break
        if finish is None:
            raise internal("the engine ended the request without a finish reason")
        self._engine_finish = finish.finish_reason
        if finish.finish_reason == "error":
            raise internal(f"generation failed: {finish.error or 'unknown engine error'}")
        if finish.finish_reason == "cancelled":
            raise ApiError(
                503, "request_cancelled", "the request was cancelled by the server (shutdown or drain)"
            )
        tail, parse = self._decoder.finish()
        yield from tail
        self._finished = self._final(finish, parse)
        yield self._finished

    def _logprob_entries(self, out: StepOutput) -> tuple[dict[str, Any], ...]:
        """OpenAI-shaped logprob entries of a step's tokens (a stop token's is not shown)."""
        return tuple(self._lp_entry(lp) for lp in out.logprobs or () if lp.token_id != out.stop_token_id)

    def _lp_entry(self, lp: TokenLogprob) -> dict[str, Any]:
        """One token's OpenAI-shaped entry: {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}."""
        tok = self._pipeline.prompts.tokenizer

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            raw = tok.token_bytes(token_id)
            return {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}

        return {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}

    def _final(self, finish: StepOutput, parse: ParseResult) -> Finished:
        calls = tuple(parse.tool_calls)
        stats = self.stats
        completion = len(self._completion_ids)
        kind: FinishKind = (
            "length" if finish.finish_reason == "length" else ("tool_calls" if calls else "stop")
        )
        usage = Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion,
            cached_tokens=stats.cached_tokens,
            reasoning_tokens=parse.reasoning_tokens,
        )
        return Finished(
            finish=kind,
            usage=usage,
            reasoning=parse.reasoning,
            content=parse.content,
            tool_calls=calls,
            stop_string=finish.stop_string,
            logprobs=tuple(self._logprobs) if self.job.params.logprobs is not None else None,
            stop_logprob=self._stop_lp,
            prompt_logprobs=self.prompt_logprobs,
        )

    @property
    def stats(self) -> RequestStats:
        return self._handle.stats

    def close(self) -> None:
        """Cancel an unfinished request, report it exactly once, then release its ticket.

        The report comes first: a live ticket keeps the throughput reporter busy, so the report
        that shows the server settled is written after this request's `request_done`."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._finished is None and self._engine_finish is None:
                self._handle.cancel()
                self._await_cancel()
        finally:
            try:
                self._report()
            finally:
                self._ticket.release()

    def _await_cancel(self) -> None:
        """Read the cancelled request to its end (the engine acknowledges at its next step
        boundary) so the report carries the engine's final stats and every accepted id.

        Reads through a fresh iterator: the one `events()` used may already be closed with it.
        """
        if self._first is not None:
            self._completion_ids.extend(self._first.token_ids)
            self._first = None
        if self._handle.finished:
            return
        self._handle.timeout_s = CANCEL_WAIT_S
        try:
            for out in self._handle:
                self._completion_ids.extend(out.token_ids)
                if out.finish_reason is not None:
                    break
        except Exception:  # timed out or failed: report what is known
            pass

    def _report(self) -> None:
        observer = self._pipeline.observer
        if self._error is not None:
            observer.failed(self.request_id, self.job, self._error, self.stats)
            return
        summary: dict[str, Any] = {
            "finish_reason": self._finished.finish if self._finished else "cancelled",
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(self._completion_ids),
            "reasoning_tokens": self._finished.usage.reasoning_tokens if self._finished else None,
            "tool_calls": len(self._finished.tool_calls) if self._finished else 0,
            "prepare_s": self.prepare_s,
        }
        observer.done(self.request_id, self.job, summary, self.stats)
