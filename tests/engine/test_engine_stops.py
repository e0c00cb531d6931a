"""Stop strings and visible text through the engine, with the real tokenizer."""

from __future__ import annotations

from dataclasses import replace

from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.types import GenerationRequest, SamplingParams
from ninfer.text.detok import IncrementalDetokenizer


def test_stop_string_withheld_and_tokens_committed(qwen_vocab_model, tokenizer) -> None:
    cfg = replace(EngineConfig(), max_concurrency=1, max_context=256, prefill_chunk=64)
    eng = Engine(qwen_vocab_model, cfg, lambda: IncrementalDetokenizer(tokenizer)).start()
    base = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    try:
        for salt in range(20):
            prompt = tuple(tokenizer.encode(f"Conversation {salt}: tell me about the sea and the sky."))
            with eng.submit(eng.reserve(), GenerationRequest("a", prompt, base)) as h:
                outs = list(h)
            tokens = [t for o in outs for t in o.token_ids]
            if max(tokens) >= tokenizer.vocab_size:
                continue  # an unused embedding row: not decodable, try another prompt
            full = tokenizer.decode(tokens)
            assert "".join(o.text for o in outs) == full
            if len(full) < 12 or "\ufffd" in full:
                continue
            stop = full[5:9]  # usually spans a token boundary
            params = replace(base, stop=(stop,))
            with eng.submit(eng.reserve(), GenerationRequest("b", prompt, params)) as h:
                outs = list(h)
            got = [t for o in outs for t in o.token_ids]
            last = outs[-1]
            assert (last.finish_reason, last.stop_string) == ("stop", stop)
            assert "".join(o.text for o in outs) == full[: full.index(stop)]
            assert got == tokens[: len(got)] and stop in tokenizer.decode(got)
            assert stop not in tokenizer.decode(got[:-1]) and h.stats.completion_tokens == len(got)
            return
        raise AssertionError("no decodable output found")
    finally:
        eng.shutdown(5)
