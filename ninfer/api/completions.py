"""POST /v1/completions: legacy OpenAI text completions over the raw prompt (no chat template).

One prompt per request (a string, token ids, or a one-element array of either); `max_tokens`,
`stop`, `echo`, `stream` (with `stream_options.include_usage`) and `logprobs` (0..20 alternatives
per token, in the legacy shape: tokens, token_logprobs, top_logprobs, text_offset) work. `echo`
with `logprobs` (the prompt-scoring request of loglikelihood evaluations) puts the prompt's tokens
first, with the model's logprob of each given the tokens before it (null for the first), computed
from the prefill; `max_tokens` may then be 0 (scoring only). The `prompt_logprobs` extension (0..20
alternatives) returns the same prompt entries in the Chat entry shape as `choices[0].prompt_logprobs`.
Generation runs with thinking off and no tool parsing: the visible text is returned as is.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import falcon

from ninfer.api import fields as f
from ninfer.api import sse
from ninfer.api.chat.request import sampling_params
from ninfer.api.context import ApiContext, caller
from ninfer.api.errors import invalid, unsupported
from ninfer.api.events import Finished, GenerationJob, LogprobsDelta, TextDelta
from ninfer.api.fields import parse_body
from ninfer.api.parse_guard import guarded
from ninfer.api.pipeline import Generation
from ninfer.engine.config import MAX_LOGPROBS
from ninfer.frontend.conversation import Conversation
from ninfer.frontend.options import RequestOptions
from ninfer.text.tokenizer import Tokenizer

LOGPROBS_MAX = MAX_LOGPROBS  # alternatives per token (the engine's bound; OpenAI's legacy API allows 5)

KNOWN = (
    "model", "prompt", "max_tokens", "stop", "echo", "logprobs", "stream", "stream_options",
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "seed", "n",
    "best_of", "suffix", "user", "prompt_logprobs",
)  # fmt: skip


def prompt_ids(value: Any, tokenizer: Tokenizer, param: str = "prompt") -> tuple[tuple[int, ...], str]:
    """(token ids, prompt text) of a string or token-id prompt; a batch must hold one prompt."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise invalid(param, "prompt must not be empty", "invalid_value")
        return tuple(tokenizer.encode(value)), value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        vocab = tokenizer.vocab_size
        if any(t < 0 or t >= vocab for t in value):
            raise invalid(param, f"token ids must be in 0..{vocab - 1}", "invalid_value")
        return tuple(value), tokenizer.decode(value)
    raise invalid(
        param, "prompt must be a non-empty string or token-id array (one prompt per request)", "invalid_type"
    )


@guarded
def parse(body: dict[str, Any], ctx: ApiContext) -> tuple[GenerationJob, str, str, bool]:
    """The job, the model label, the prompt text (for echo), and include_usage."""
    f.reject_unknown(body, KNOWN)
    model = f.req_str(body, "model")
    ctx.check_model(model)
    logprobs = _logprobs(body)
    echo = bool(f.opt_bool(body, "echo"))
    scoring = (f.opt_int(body, "prompt_logprobs", 0, LOGPROBS_MAX), logprobs if echo else None)
    prompt_top = max((n for n in scoring if n is not None), default=None)
    for key in ("n", "best_of"):
        if f.opt_int(body, key, 1) not in (None, 1):
            raise unsupported(key, f"{key} must be 1: one completion per request")
    if f.opt_str(body, "suffix"):
        raise unsupported("suffix", "suffix (insertion) is not supported")
    if body.get("prompt") is None:
        raise invalid("prompt", "missing required parameter: 'prompt'", "missing_required_parameter")
    ids, text = prompt_ids(body["prompt"], ctx.tokenizer())
    max_tokens = f.opt_int(body, "max_tokens", 0)
    if max_tokens == 0 and prompt_top is None:
        raise invalid(
            "max_tokens",
            "max_tokens must be >= 1 unless the prompt is scored (echo with logprobs, or prompt_logprobs)",
        )
    stream = bool(f.opt_bool(body, "stream"))
    options = f.opt_dict(body, "stream_options")
    if options is not None and not stream:
        raise invalid("stream_options", "stream_options is only allowed with stream=true")
    f.reject_unknown(options or {}, ("include_usage",), "stream_options.")
    include_usage = bool(f.opt_bool(options or {}, "include_usage", "stream_options.include_usage"))
    job = GenerationJob(
        protocol="completions",
        conversation=Conversation(messages=[]),
        controls=RequestOptions(),
        params=replace(
            sampling_params(body, max_tokens),
            max_tokens=1 if max_tokens is None else max_tokens,  # 0: score the prompt only
            logprobs=logprobs,
            prompt_logprobs=prompt_top,
        ),
        max_tokens_given=max_tokens is not None,
        stream=stream,
        shape={
            "prompt_tokens_given": len(ids),
            "stream": stream,
            "echo": echo,
            "tools": 0,
            "prompt_logprobs": scoring[0] is not None,
        },
        raw_prompt=ids,
    )
    return job, model, text if echo else "", include_usage


def _logprobs(body: dict[str, Any]) -> int | None:
    """Legacy `logprobs`: the number of alternatives per generated token (0: the chosen one's
    logprob only); None or false is off."""
    if body.get("logprobs") is False:
        return None
    return f.opt_int(body, "logprobs", 0, LOGPROBS_MAX)


def legacy_logprobs(entries: Sequence[dict[str, Any]], offset: int = 0) -> dict[str, list[Any]]:
    """Chat-shaped logprob entries -> the legacy completions object; `text_offset` counts
    characters of the returned text from `offset`."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for entry in entries:
        out["tokens"].append(entry["token"])
        out["token_logprobs"].append(entry["logprob"])
        out["top_logprobs"].append({t["token"]: t["logprob"] for t in entry["top_logprobs"]})
        out["text_offset"].append(offset)
        offset += len(entry["token"])
    return out


def echo_logprobs(prompt: Sequence[dict[str, Any] | None], first: str, top: int) -> dict[str, list[Any]]:
    """The prompt's entries (None for the first token, whose text is `first`) in the legacy
    shape, `top` alternatives each, offsets from the start of the echoed text."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for i, entry in enumerate(prompt):
        if entry is None:  # the first token: nothing precedes it (its text still counts)
            out["tokens"].append(first)
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
        else:
            out["tokens"].append(entry["token"])
            out["token_logprobs"].append(entry["logprob"])
            out["top_logprobs"].append({t["token"]: t["logprob"] for t in entry["top_logprobs"][:top]})
        out["text_offset"].append(offset)
        offset += len(out["tokens"][i])
    return out


def _joined(first: dict[str, list[Any]], then: dict[str, list[Any]] | None) -> dict[str, list[Any]]:
    return first if then is None else {k: first[k] + then[k] for k in first}


def _usage(done: Finished) -> dict[str, int]:
    u = done.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }


def _finish(done: Finished) -> str:
    return "length" if done.finish == "length" else "stop"


def _stream(
    gen: Generation, head: dict[str, Any], echo: str, include_usage: bool, first: str
) -> Iterator[bytes]:
    def chunk(
        text: str,
        finish: str | None = None,
        logprobs: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> bytes:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs, **(extra or {})}
        body = {**head, "choices": [choice]}
        return sse.frame({**body, "usage": None} if include_usage else body)

    def frames() -> Iterator[bytes]:
        offset = len(echo)  # generated tokens' offsets count from the end of the echoed prompt
        echoed, scored = _prompt_parts(gen, first)
        if echo or scored is not None:
            yield chunk(echo, logprobs=echoed, extra=scored)
        for event in gen.events():
            if isinstance(event, LogprobsDelta):  # a step's tokens, before that step's text
                yield chunk("", logprobs=legacy_logprobs(event.entries, offset))
                offset += sum(len(e["token"]) for e in event.entries)
            elif isinstance(event, TextDelta):
                yield chunk(event.text)
            elif isinstance(event, Finished):
                if echoed is not None and event.stop_logprob is not None:  # scoring: the stop token too
                    yield chunk("", logprobs=legacy_logprobs([event.stop_logprob], offset))
                yield chunk("", _finish(event))
                if include_usage:
                    yield sse.frame({**head, "choices": [], "usage": _usage(event)})

    return sse.openai_stream(frames(), gen.close, "completion")


class CompletionsResource:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        pipeline = self.ctx.require_pipeline()
        job, model, echo, include_usage = parse(parse_body(req.context.body), self.ctx)
        gen = pipeline.open(job, caller(req))
        head = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.ctx.model_id or model,
        }
        resp.set_header("x-request-id", str(gen.request_id))
        assert job.raw_prompt is not None
        first = self.ctx.tokenizer().token_bytes(job.raw_prompt[0]).decode("utf-8", "replace")
        if job.stream:
            resp.content_type = sse.CONTENT_TYPE
            resp.set_headers(sse.headers())
            resp.stream = _stream(gen, head, echo, include_usage, first)
            return
        try:
            done = gen.collect()
        finally:
            gen.close()
        text = echo + "".join(p for p in (done.reasoning, done.content) if p)
        logprobs = None if done.logprobs is None else legacy_logprobs(done.logprobs, len(echo))
        echoed, scored = _prompt_parts(gen, first)
        if echoed is not None:  # the prompt's tokens first, then every generated one (a stop token too)
            entries = [*(done.logprobs or ()), *([done.stop_logprob] if done.stop_logprob else [])]
            logprobs = _joined(echoed, legacy_logprobs(entries, len(echo)))
        choice = {
            "index": 0,
            "text": text,
            "finish_reason": _finish(done),
            "logprobs": logprobs,
            **(scored or {}),
        }
        resp.media = {**head, "choices": [choice], "usage": _usage(done)}


def _prompt_parts(gen: Generation, first: str) -> tuple[dict[str, list[Any]] | None, dict[str, Any] | None]:
    """The echoed prompt's legacy logprobs (echo with logprobs) and the `prompt_logprobs` field
    (the extension), each None when not asked for."""
    scored = gen.prompt_logprobs
    if scored is None:
        return None, None
    params = gen.job.params
    echoed = (
        echo_logprobs(scored, first, params.logprobs or 0)
        if gen.job.shape.get("echo") and params.logprobs is not None
        else None
    )
    extension = {"prompt_logprobs": list(scored)} if gen.job.shape.get("prompt_logprobs") else None
    return echoed, extension


def routes(ctx: ApiContext) -> list[tuple[str, object]]:
    return [("/v1/completions", CompletionsResource(ctx))]
