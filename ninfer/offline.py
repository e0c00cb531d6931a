"""Offline `LLM` for scripts, tests and benchmarks: full-forward logits and generation through the engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ninfer.engine.types import FinishReason, SamplingParams
from ninfer.model.cache import PAGE_SIZE, KVPool, StatePool, make_batch
from ninfer.model.qwen35 import Qwen35Model
from ninfer.model.weights import load_model

if TYPE_CHECKING:
    from ninfer.config import Settings
    from ninfer.engine.engine import Engine
    from ninfer.text.tokenizer import Tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PREFILL_CHUNK = 512


@dataclass(frozen=True)
class GenerationOutput:
    """One prompt's completion (token ids include a stop token when one ended it)."""

    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str | None  # None when no tokenizer is available
    finish_reason: FinishReason
    cached_tokens: int = 0


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def _settings(lanes: int, max_context: int) -> Settings:
    """The offline engine's settings: `lanes` sequences of `max_context` tokens (whole pages) in one KV
    pool, requests that wait as long as a script does; the settings models' defaults otherwise (the
    process's NINFER_* variables are not read)."""
    from ninfer.config.loader import settings_from_tree

    max_context = -(-max_context // PAGE_SIZE) * PAGE_SIZE
    engine = {
        "max_concurrency": lanes,
        "max_pending_requests": 64,
        "pending_timeout_ms": 24 * 3600 * 1000,
        "prefill_chunk": PREFILL_CHUNK,
        "max_context": max_context,
    }
    return settings_from_tree({"engine": engine, "kv": {"capacity": lanes * max_context}}, env=False)


class LLM:
    """A model loaded from a `.ninfer` artifact (or given directly), for scripts, tests and benchmarks."""

    def __init__(
        self, artifact_path: str | Path, device: str = "cpu", dtype: str | torch.dtype = "float32"
    ) -> None:
        from ninfer.artifact import open_artifact

        art = open_artifact(artifact_path)
        tensors = dict(art.load_tensors("text"))
        if art.has_component("mtp"):
            tensors.update(art.load_tensors("mtp"))
        model = load_model(art.config, tensors, dtype=_dtype(dtype), device=device, consume=True)
        tokenizer = None
        if Path(art.tokenizer_path).is_file():
            from ninfer.text.tokenizer import Tokenizer

            tokenizer = Tokenizer.from_file(art.tokenizer_path)
        self._setup(model, tokenizer)

    @classmethod
    def from_model(cls, model: Qwen35Model, tokenizer: Tokenizer | None = None) -> LLM:
        """Wrap an already built model (tests, benchmarks)."""
        llm = cls.__new__(cls)
        llm._setup(model, tokenizer)
        return llm

    def _setup(self, model: Qwen35Model, tokenizer: Tokenizer | None) -> None:
        self.model = model
        self.config = model.config
        self.tokenizer = tokenizer
        self.device = model.device
        self.dtype = model.dtype
        self._engine_obj: Engine | None = None

    # ----- state for one sequence -----
    def _pools(self, total_tokens: int) -> tuple[KVPool, StatePool, list[int]]:
        n_pages = max(1, -(-total_tokens // PAGE_SIZE))
        kv = KVPool.for_config(self.config, n_pages, self.dtype, self.device)
        states = StatePool.for_config(self.config, 1, self.dtype, self.device)
        return kv, states, list(range(n_pages))

    def _run(
        self, ids: Sequence[int], kv: KVPool, states: StatePool, pages: list[int], start: int
    ) -> torch.Tensor:
        """Feed `ids` after `start` cached tokens, in chunks. -> hidden [len(ids), H]"""
        out = []
        for i in range(0, len(ids), PREFILL_CHUNK):
            chunk = list(ids[i : i + PREFILL_CHUNK])
            batch = make_batch([chunk], [start + i], [0], [pages], device=self.device)
            out.append(self.model(batch, kv, states)[0])
        return torch.cat(out, 0)

    @torch.inference_mode()
    def logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Float32 logits [T, vocab] of one forward over `token_ids` from an empty cache."""
        ids = list(token_ids)
        if not ids:
            raise ValueError("token_ids is empty")
        kv, states, pages = self._pools(len(ids))
        return self.model.logits(self._run(ids, kv, states, pages, 0))

    def _encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("string prompts need a tokenizer; pass token ids instead")
            return list(self.tokenizer.encode(prompt))
        return [int(t) for t in prompt]

    # ----- generation through the engine -----
    def _engine(self, lanes: int, max_context: int) -> Engine:
        """The offline engine, rebuilt only when a call needs more lanes or a longer context."""
        from ninfer.bootstrap import engine_for_model

        cur = self._engine_obj
        if cur is not None and cur.config.max_concurrency >= lanes and cur.config.max_context >= max_context:
            return cur
        self.close()
        self._engine_obj = engine_for_model(_settings(lanes, max_context), self.model, self.tokenizer).start()
        return self._engine_obj

    def close(self) -> None:
        """Stop the offline engine thread (it is restarted on the next `generate`)."""
        if self._engine_obj is not None:
            self._engine_obj.shutdown(5.0)
            self._engine_obj = None

    def generate(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        params: SamplingParams | None = None,
    ) -> list[GenerationOutput]:
        """Complete each prompt (a string, or a list of token ids) through the engine.

        Prompts run together with continuous batching (up to 8 at once), with the engine's
        sampling (greedy for `temperature=0.0`; `seed` makes sampling reproducible), stop ids
        and strings, and prefix reuse across calls (`cached_tokens`). Unset sampling fields
        mean neutral sampling (temperature 1, no top-k/top-p cut).
        """
        from ninfer.engine.types import GenerationRequest

        p = params or SamplingParams(temperature=0.0)
        batch = self._as_list(prompts)
        ids = [self._encode(pr) for pr in batch]
        if any(not x for x in ids):
            raise ValueError("empty prompt")
        max_tokens = p.max_tokens if p.max_tokens is not None else 16
        engine = self._engine(min(8, len(ids)), max(len(x) for x in ids) + max_tokens)
        handles = [
            engine.submit(engine.reserve(), GenerationRequest(f"offline-{i}", tuple(x), p))
            for i, x in enumerate(ids)
        ]
        outputs = []
        for x, handle in zip(ids, handles, strict=True):
            with handle:
                tokens: list[int] = []
                texts: list[str] = []
                for out in handle:
                    tokens.extend(out.token_ids)
                    if out.text:
                        texts.append(out.text)
                    if out.finish_reason == "error":
                        raise RuntimeError(f"generation failed: {out.error}")
                text = "".join(texts) if self.tokenizer is not None else None
                reason: FinishReason = out.finish_reason or "length"
                outputs.append(
                    GenerationOutput(tuple(x), tuple(tokens), text, reason, handle.stats.cached_tokens)
                )
        return outputs

    # ----- the plain reference loop -----
    def _as_list(self, prompts: str | Sequence[int] | Sequence[str | Sequence[int]]) -> list[Any]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            return [prompts]
        return list(prompts)

    @torch.inference_mode()
    def generate_reference(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        params: SamplingParams | None = None,
    ) -> list[GenerationOutput]:
        """Greedy completion, one sequence at a time, without the engine: the test oracle for it."""
        p = params or SamplingParams(temperature=0.0)
        if p.temperature is None or p.temperature > 0:
            raise ValueError(
                f"the reference loop decodes greedily: pass temperature=0.0 (got {p.temperature!r})"
            )
        if p.stop:
            raise ValueError("the reference loop does not match stop strings")
        if p.max_tokens is None or p.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if p.stop_token_ids is not None:
            stop_ids = set(p.stop_token_ids)
        else:
            stop_ids = set() if p.ignore_eos else set(self.config.eos_token_ids)
        return [self._greedy(self._encode(pr), p, stop_ids) for pr in self._as_list(prompts)]

    def _greedy(self, prompt: list[int], p: SamplingParams, stop_ids: set[int]) -> GenerationOutput:
        if not prompt:
            raise ValueError("empty prompt")
        kv, states, pages = self._pools(len(prompt) + p.max_tokens)
        hidden = self._run(prompt, kv, states, pages, 0)[-1:]
        out: list[int] = []
        reason: FinishReason = "length"
        while True:
            tok = int(self.model.logits(hidden).argmax(-1)[-1])
            out.append(tok)
            if tok in stop_ids:
                reason = "stop"
                break
            if len(out) >= p.max_tokens:
                break
            hidden = self._run([tok], kv, states, pages, len(prompt) + len(out) - 1)
        shown = out[:-1] if reason == "stop" else out
        text = self.tokenizer.decode(shown) if self.tokenizer is not None else None
        return GenerationOutput(tuple(prompt), tuple(out), text, reason)
