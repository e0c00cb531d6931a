"""Grammar-constrained decoding: xgrammar grammars compiled once per spec (bounded LRU cache) and
per-request matchers whose masks start where the answer starts.

A thinking request's reasoning is free: the mask admits everything until the end-of-thinking
token is sampled, then the grammar constrains the answer. The reasoning may use at most half of
the request's output entitlement; at that point only the end-of-thinking token is admitted, so
the constrained answer always has room. With thinking off the grammar starts at the first token.
After the grammar is complete only the stop tokens are admitted.

Speculative verification looks ahead: `advance` accepts a draft tentatively (reasoning phase and
budget included, exactly as `accept` would) so that `fill` gives the mask of the next position,
and `rewind` returns to the committed state; the engine then commits the verified tokens through
`accept`, as on the plain path.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ninfer.engine import json_schema
from ninfer.engine.sampler import word_bit
from ninfer.engine.types import ConstraintSpec

log = logging.getLogger("ninfer.engine.grammar")

CACHE_SIZE = 64  # compiled grammars kept (distinct schemas), least recently used evicted
THINK_END = "</think>"


class GrammarError(ValueError):
    """A schema or grammar the engine cannot compile (HTTP 400 on `param`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param
        self.message = message


class GrammarUnavailable(GrammarError):
    """This engine cannot constrain output at all (no tokenizer)."""


class Grammars:
    """The process's grammar compiler over the model's vocabulary; thread-safe, lazy (the
    tokenizer tables take ~2 s to build: on the first constrained request, or before ready where
    the engine warms up, `build_tables`)."""

    def __init__(self, tokenizer_path: str | Path, vocab_size: int, stop_ids: Iterable[int]) -> None:
        self.tokenizer_path = str(tokenizer_path)
        self.vocab_size = vocab_size
        self.stop_ids = sorted(stop_ids)
        self._lock = threading.Lock()
        self._compiler: Any = None
        self._think_end: int | None = None
        self._cache: OrderedDict[ConstraintSpec, Any] = OrderedDict()
        self.tables_s: float | None = None  # what building the tokenizer tables took, once built

    def build_tables(self) -> None:
        """Build the tokenizer tables now (the engine's warm-up), not in the first constrained
        request. A failure (e.g. xgrammar missing) is logged and left to the constrained requests,
        which fail as they would have: the engine serves everything else."""
        try:
            with self._lock:
                self._ensure()
        except Exception as exc:
            log.warning("grammar tables not built before ready (%s: %s)", type(exc).__name__, exc)

    def _ensure(self) -> Any:
        if self._compiler is None:
            t0 = time.perf_counter()
            import xgrammar as xgr
            from transformers import PreTrainedTokenizerFast

            hf = PreTrainedTokenizerFast(tokenizer_file=self.tokenizer_path)
            info = xgr.TokenizerInfo.from_huggingface(
                hf, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids
            )
            self._think_end = hf.convert_tokens_to_ids(THINK_END)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            self.tables_s = time.perf_counter() - t0
        return self._compiler

    def compiled(self, spec: ConstraintSpec) -> Any:
        """The compiled grammar of `spec` (cached); raises GrammarError."""
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
            compiler = self._ensure()
            try:
                if spec.kind == "json_object":
                    grammar = compiler.compile_builtin_json_grammar()
                else:
                    grammar = compiler.compile_grammar(_ebnf(spec))
            except json_schema.SchemaRefused as exc:
                raise GrammarError(spec.param, str(exc)[:500]) from None
            except Exception as exc:  # xgrammar raises RuntimeError / ValueError with the cause
                msg = f"invalid or unsupported schema: {json_schema.engine_message(exc)}"[:500]
                raise GrammarError(spec.param, msg) from exc
            self._cache[spec] = grammar
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return grammar

    def constraint(self, spec: ConstraintSpec, thinking: bool, entitlement: int) -> GrammarConstraint:
        """A fresh matcher for one request."""
        import xgrammar as xgr

        grammar = self.compiled(spec)
        think_end = self._think_end if thinking else None
        return GrammarConstraint(xgr.GrammarMatcher(grammar), think_end, max(0, entitlement // 2))


def _ebnf(spec: ConstraintSpec) -> str:
    """The grammar of a json_schema or structural_tag spec as EBNF: its schemas rewritten and
    its JSON strings fixed (`ninfer.engine.json_schema`)."""
    import xgrammar as xgr

    if spec.kind == "json_schema":
        source = json_schema.rewrite(json.loads(spec.source))
        grammar = xgr.Grammar.from_json_schema(
            json.dumps(source), any_whitespace=False, strict_mode=spec.strict
        )
    else:
        source = json_schema.rewrite_tag(json.loads(spec.source))
        grammar = xgr.Grammar.from_structural_tag(json.dumps(source))
    return json_schema.json_strings(str(grammar), source)


class GrammarConstraint:
    """One request's mask state (`ninfer.engine.sampler.TokenConstraint`)."""

    def __init__(self, matcher: Any, think_end: int | None, reasoning_budget: int) -> None:
        self.matcher = matcher
        self.think_end = think_end  # None: the answer (grammar) starts at the next token
        self.reasoning_left = reasoning_budget
        self.rejected = 0  # tokens the grammar did not accept (never expected: the mask forbids them)
        self._committed: tuple[int | None, int] | None = None  # (think_end, reasoning_left) to rewind to
        self._ahead = 0  # matcher tokens accepted by `advance` since the last `rewind`

    @property
    def in_reasoning(self) -> bool:
        return self.think_end is not None

    def fill(self, words: torch.Tensor) -> bool:
        if self.think_end is not None:
            if self.reasoning_left > 0:
                return False  # free reasoning (the end of thinking admitted among everything)
            words.zero_()  # reasoning budget spent: only the end of thinking
            words[self.think_end // 32] = word_bit(self.think_end % 32)
            return True
        if self.matcher.is_terminated():
            return False  # the stop token was accepted: the request is ending
        import xgrammar as xgr

        xgr.GrammarMatcher.fill_next_token_bitmask(self.matcher, words.view(1, -1), 0)
        return True

    def accept(self, token: int) -> None:
        if self.think_end is not None:
            self._reason(token)
            return
        if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
            self.rejected += 1

    def _reason(self, token: int) -> None:
        self.reasoning_left -= 1
        if token == self.think_end:
            self.think_end = None

    def advance(self, token: int) -> bool:
        """Accept a draft token tentatively, as `accept` would, until `rewind`; False (state
        unchanged) when the current mask does not admit it."""
        if self._committed is None:
            self._committed = (self.think_end, self.reasoning_left)
        if self.think_end is not None:
            if self.reasoning_left <= 0 and token != self.think_end:
                return False
            self._reason(token)
            return True
        if self.matcher.is_terminated():
            return True  # unconstrained (the request ends at the stop token)
        if not self.matcher.accept_token(token):
            return False
        self._ahead += 1
        return True

    def rewind(self) -> None:
        """Back to the committed state: undo every `advance` since the last rewind."""
        if self._committed is not None:
            self.think_end, self.reasoning_left = self._committed
            self._committed = None
        if self._ahead:
            self.matcher.rollback(self._ahead)
            self._ahead = 0
