"""One conversation answered: the artifact checked and opened, the server's frontend and engine
built (`FrontendPrompts`, `bootstrap.build_engine`), the job run through the server's `Pipeline`,
the answer streamed to stdout and the rest to stderr. Exit 0 answered, 2 bad input or settings
the artifact cannot honour (before any weight loads), 1 a failure while loading or generating."""

from __future__ import annotations

import itertools
import json
from typing import Any, TextIO

from ninfer.api.errors import ApiError
from ninfer.api.events import Finished, GenerationJob, ReasoningDelta, TextDelta
from ninfer.api.pipeline import Pipeline
from ninfer.api.ports import Prepared
from ninfer.config import Settings
from ninfer.engine.types import GenerationRequest, RequestStats
from ninfer.oneshot.progress import Progress
from ninfer.oneshot.report import Outcome, lines

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class Refused(Exception):
    """Input or settings refused before generation: one line, exit 2."""


class _Observer:
    """The pipeline's observer: keeps the one request's stats for the report (no request log)."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def rejected(self, request_id: int, job: GenerationJob, error: ApiError, prepare_s: float) -> None:
        self.outcome.prepare_s = prepare_s

    def started(
        self,
        request_id: int,
        job: GenerationJob,
        prepared: Prepared,
        request: GenerationRequest,
        stats: RequestStats,
    ) -> None:
        self.outcome.stats = stats

    def done(self, request_id: int, job: GenerationJob, summary: dict[str, Any], stats: RequestStats) -> None:
        self.outcome.summary, self.outcome.stats = summary, stats

    def failed(
        self, request_id: int, job: GenerationJob, error: ApiError, stats: RequestStats | None
    ) -> None:
        if stats is not None:
            self.outcome.stats = stats


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _api_message(exc: ApiError) -> str:
    return f"{exc.param}: {_one_line(exc)}" if exc.param else _one_line(exc)


def _capability(settings: Settings) -> tuple[int, int] | None:
    import torch

    device = settings.engine.torch_device(torch.cuda.is_available())
    return None if device == "cpu" else torch.cuda.get_device_capability(torch.device(device))


def _frontend(settings: Settings, body: dict[str, Any], progress: Progress) -> tuple[Any, Any, GenerationJob]:
    """Open and check the artifact, build the server's frontend over it and parse the conversation
    with the Chat Completions parser: everything that can refuse the run, before any weight loads."""
    from ninfer.api.chat.request import parse
    from ninfer.api.context import ApiContext
    from ninfer.api.prompting import FrontendPrompts
    from ninfer.artifact import ArtifactError, ensure_demo_artifact, open_artifact
    from ninfer.bootstrap import unsupported_formats
    from ninfer.config import check_artifact_settings
    from ninfer.config.errors import ConfigError
    from ninfer.frontend.options import ServerDefaults
    from ninfer.text.tokenizer import Tokenizer

    progress.phase("opening the artifact")
    try:
        artifact = open_artifact(settings.model.artifact or str(ensure_demo_artifact()))
        check_artifact_settings(settings, artifact)
    except (ArtifactError, ConfigError) as exc:
        raise Refused(_one_line(exc)) from None
    if artifact.quantized:
        why = unsupported_formats(artifact, _capability(settings))
        if why is not None:
            raise Refused(f"{artifact.path}: {why}")
    tokenizer = Tokenizer.from_file(artifact.tokenizer_path)
    media = None
    if settings.vision.enabled:
        from ninfer.api.media_prompt import build_media_prompts

        media = build_media_prompts(settings.vision, settings.engine.max_context, artifact, tokenizer.encode)
    defaults = ServerDefaults(not settings.sampling.no_thinking, settings.sampling.preserve_thinking)
    prompts = FrontendPrompts(artifact.chat_template, tokenizer, defaults, media)
    model_id = settings.server.model_id or artifact.model_id
    ctx = ApiContext(vision=settings.vision.enabled, model_id=model_id)
    try:
        job = parse({**body, "model": model_id}, ctx).job
        prompts.check_options(job.controls)
    except ApiError as exc:
        raise Refused(_api_message(exc)) from None
    return artifact, prompts, job


def _stream(gen: Any, out: TextIO, err: TextIO) -> Finished:
    """The answer's text to `out` as it decodes, reasoning to `err`; the final event."""
    final: Finished | None = None
    reasoning = False
    for event in gen.events():
        if isinstance(event, TextDelta):
            out.write(event.text)
            out.flush()
        elif isinstance(event, ReasoningDelta):
            if not reasoning:
                err.write("[reasoning] ")
                reasoning = True
            err.write(event.text)
            err.flush()
        elif isinstance(event, Finished):
            final = event
    if reasoning:
        err.write("\n[/reasoning]\n")
    assert final is not None  # events() ends with Finished or raises
    if final.content and not final.content.endswith("\n"):
        out.write("\n")
    for call in final.tool_calls:  # one JSON object a line, after the text
        out.write(json.dumps({"tool_call": call.name, "id": call.id, "arguments": call.arguments}) + "\n")
    out.flush()
    return final


def run(settings: Settings, body: dict[str, Any], prog: str, out: TextIO, err: TextIO) -> int:
    """Answer `body` (a Chat Completions body, less its model) with the settings' artifact."""
    from ninfer.engine.types import EngineConfigError

    engine = None
    try:
        with Progress(err, prog) as progress:
            try:
                artifact, prompts, job = _frontend(settings, body, progress)
            except Refused as exc:
                progress.done("refused")
                err.write(f"{prog}: error: {exc}\n")
                return EXIT_USAGE
            from ninfer.bootstrap import build_engine

            progress.phase("loading the weights")
            try:
                engine = build_engine(settings, artifact)
            except EngineConfigError as exc:
                progress.done("refused")
                err.write(f"{prog}: error: {_one_line(exc)}\n")
                return EXIT_USAGE
            progress.phase("warming up")
            engine.start()
            if not engine.wait_ready():
                progress.done("failed")
                err.write(f"{prog}: error: the engine failed while warming up: {engine.error}\n")
                return EXIT_FAILED
            load_s = progress.done("ready")
        outcome = Outcome()
        pipeline = Pipeline(engine, prompts, _Observer(outcome), itertools.count(1).__next__)
        try:
            gen = pipeline.open(job)
        except ApiError as exc:
            err.write(f"{prog}: error: {_api_message(exc)}\n")
            return EXIT_USAGE if exc.status < 500 else EXIT_FAILED
        try:
            final = _stream(gen, out, err)
        except ApiError as exc:
            err.write(f"{prog}: error: {_api_message(exc)}\n")
            return EXIT_FAILED
        finally:
            gen.close()
        if gen.prepare_s:
            outcome.prepare_s = gen.prepare_s
        for line in lines(prog, final, outcome, load_s):
            err.write(line + "\n")
        return EXIT_OK
    except KeyboardInterrupt:
        err.write(f"\n{prog}: interrupted\n")
        return 130
    except Exception as exc:  # loading failed: one line, no traceback
        err.write(f"{prog}: error: {type(exc).__name__}: {_one_line(exc)}\n")
        return EXIT_FAILED
    finally:
        if engine is not None:
            engine.shutdown(5.0)
