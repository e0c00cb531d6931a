"""The frontend behind the pipeline's PromptPort: option resolution, rendering and output parsing."""

from __future__ import annotations

from dataclasses import replace

from ninfer.api.compat import HINT
from ninfer.api.errors import ApiError, invalid
from ninfer.api.media_prompt import MediaPrompts
from ninfer.api.ports import Prepared
from ninfer.engine.types import StepOutput
from ninfer.frontend import parser as fp
from ninfer.frontend.capabilities import resolve_capabilities
from ninfer.frontend.conversation import Conversation, Message, TextPart, Tool
from ninfer.frontend.encode import encode_prompt
from ninfer.frontend.options import (
    FrontendError,
    PromptOptions,
    RequestOptions,
    ServerDefaults,
    resolve_options,
)
from ninfer.frontend.render import TemplateError
from ninfer.text.tokenizer import Tokenizer

# an answer in the official templates' form: reasoning, text, one call (the parser's warm-up)
WARM_OUTPUT = (
    "A word to look up.\n</think>\n\nLooking it up.\n\n<tool_call>\n<function=lookup>\n"
    "<parameter=q>\nwarm\n</parameter>\n</function>\n</tool_call>"
)


class FrontendDecoder:
    """Engine visible text -> the frontend output parser's events.

    The engine owns detokenization and stop handling: `StepOutput.text` is exactly the visible
    output (a matched stop string, what follows it and stop tokens are withheld), so the parser
    never sees withheld text and there is no second stop filter here.
    """

    def __init__(self, thinking: bool, tools: list[Tool], think_end: int | None = None) -> None:
        self._parser = fp.OutputParser(thinking=thinking, tools=tools)
        self._reasoning_tokens = 0
        # reasoning tokens: the ids accepted in the reasoning channel, the end of thinking
        # (`think_end`) included, counted id by id (a speculative step may hold both channels);
        # without its id, the ids of the steps that began in the reasoning channel
        self._think_end = think_end
        self._thinking = thinking

    def feed(self, step: StepOutput) -> list[fp.Event]:
        if step.text is None:
            raise RuntimeError("the engine produced no visible text (it was built without a tokenizer)")
        if self._think_end is None:
            if self._parser.in_reasoning:  # ids accepted while in the reasoning channel
                self._reasoning_tokens += sum(1 for t in step.token_ids if t != step.stop_token_id)
        else:
            for t in step.token_ids:
                if not self._thinking:
                    break
                if t != step.stop_token_id:
                    self._reasoning_tokens += 1
                if t == self._think_end:
                    self._thinking = False
        return self._parser.feed_text(step.text) if step.text else []

    def finish(self) -> tuple[list[fp.Event], fp.ParseResult]:
        events = self._parser.finish()
        return events, replace(self._parser.result, reasoning_tokens=self._reasoning_tokens)


class FrontendPrompts:
    """PromptPort over the artifact's chat template and tokenizer."""

    def __init__(
        self, template: str, tokenizer: Tokenizer, defaults: ServerDefaults, media: MediaPrompts | None = None
    ) -> None:
        self.media = media  # None: vision off (media parts are refused while parsing)
        self.template = template
        self.tokenizer = tokenizer
        self.defaults = defaults
        self.caps = resolve_capabilities(template)

    def _options(self, controls: RequestOptions) -> PromptOptions:
        try:
            return resolve_options(controls, self.caps, self.defaults)
        except FrontendError as exc:
            message = exc.message
            if exc.code == "reasoning_effort_not_supported":
                message += HINT  # --client-compat maps such an effort to the nearest exposed one
            raise ApiError(400, exc.code, message, exc.param) from None

    def check_options(self, controls: RequestOptions) -> None:
        self._options(controls)

    def warm(self) -> fp.ParseResult:
        """Render, tokenize and parse one tool conversation before ready: the template compiles
        on first use, and the first request of a served H200 run paid ~0.1 s of prepare for it."""
        tool = Tool("lookup", "Look a word up.", {"type": "object", "properties": {"q": {"type": "string"}}})
        conv = Conversation([Message("user", [TextPart("Look up 'warm'.")])], tools=[tool])
        prepared = self.prepare(conv, RequestOptions(), tools_present=True)
        parser = fp.OutputParser(thinking=prepared.thinking, tools=[tool])
        parser.feed_text(WARM_OUTPUT if prepared.thinking else WARM_OUTPUT.split("</think>\n\n")[1])
        parser.finish()
        return parser.result

    def prepare(
        self,
        conversation: Conversation,
        controls: RequestOptions,
        tools_present: bool,
        deadline: float | None = None,
    ) -> Prepared:
        options = self._options(controls)
        try:
            prompt = encode_prompt(conversation, options, self.template, self.tokenizer, self.caps)
        except TemplateError as exc:
            raise invalid(
                "messages", f"the chat template rejected the conversation: {exc}", "invalid_prompt"
            ) from None
        token_ids = tuple(prompt.token_ids)
        turn, response = prompt.turn_checkpoint, prompt.response_checkpoint
        multimodal, media_log = None, None
        if prompt.media:
            if self.media is None:
                raise ApiError(
                    400,
                    "vision_disabled",
                    "media input requires a server started with vision enabled",
                    "messages",
                )
            exp = self.media.expand(prompt.token_ids, prompt.media, deadline, turn, response)
            token_ids, turn, response = exp.token_ids, exp.turn_checkpoint, exp.response_checkpoint
            multimodal, media_log = exp.multimodal, exp.log
        return Prepared(
            token_ids=token_ids,
            thinking=options.thinking,
            preserve_thinking=options.preserve_thinking,
            effort=options.effort,
            turn_checkpoint=turn,
            response_checkpoint=response,
            media_items=len(prompt.media),
            multimodal=multimodal,
            media_log=media_log,
        )

    def decoder(self, prepared: Prepared, tools: list[Tool]) -> FrontendDecoder:
        return FrontendDecoder(prepared.thinking, tools, self.tokenizer.token_to_id("</think>"))
