"""int8 KV rows: decode tokens/s with `kv_dtype=int8` against the model-dtype KV, and greedy agreement.

Agreement is measured on the engine's outputs: the same prompts decoded greedily with both KV
dtypes; per prompt the number of leading tokens that agree and the fraction of equal positions.
On random weights the logits are nearly flat, so a quantisation error of ~0.4% per K/V entry can
flip a near-tie early; the first-divergence index says how long the two stay identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ninfer.engine.engine import Engine
from ninfer.model.qwen35 import Qwen35Model
from ops.bench.engine_runs import EngineSpec, free, make_engine, run_requests
from ops.bench.shapes import random_prompt


def greedy_tokens(engine: Engine, prompts: list[tuple[int, ...]], n: int) -> list[list[int]]:
    """Greedy continuations of n tokens, one request at a time (no batching effects)."""
    from ninfer.engine.types import GenerationRequest, SamplingParams

    outs = []
    for i, p in enumerate(prompts):
        req = GenerationRequest(
            request_id=f"int8-{i}",
            prompt_ids=p,
            params=SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
        )
        with engine.submit(engine.reserve(), req) as handle:
            tokens, _ = handle.result(600)
        outs.append(tokens)
    return outs


def agreement(a: list[int], b: list[int]) -> tuple[int, float]:
    """(leading tokens equal, fraction of equal positions)."""
    lead = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    return lead, sum(x == y for x, y in zip(a, b, strict=True)) / max(len(a), 1)


def int8_kv_section(
    model: Qwen35Model,
    es: EngineSpec,
    context: int,
    batches: tuple[int, ...],
    decode_tokens: int,
    plain_tok_s: dict[str, float],
    log: Callable[[str], None],
    agree_prompts: int = 4,
    agree_tokens: int = 64,
) -> dict[str, Any]:
    """The `int8_kv` JSON of one model: decode tok/s per batch size and its ratio to the model-dtype
    KV figures in `plain_tok_s`, greedy agreement over `agree_prompts` prompts."""
    vocab = model.config.vocab_size
    lanes = max(batches)
    prompts = [random_prompt(min(context, 512), 700 + i, vocab) for i in range(agree_prompts)]
    out: dict[str, Any] = {"decode_tok_s": {}, "decode_vs_model_dtype": {}, "context": context}
    eng = make_engine(model, es, context + decode_tokens + lanes + 64, lanes)
    try:
        ref = greedy_tokens(eng, prompts, agree_tokens)
    finally:
        free(eng)
    eng = make_engine(model, es, context + decode_tokens + lanes + 64, lanes, kv_dtype="int8")
    try:
        run_requests(eng, [random_prompt(min(256, context), 99, vocab)], 4)  # warm-up
        for bs in batches:
            r = run_requests(eng, [random_prompt(context, 1000 * bs + i, vocab) for i in range(bs)],
                             decode_tokens + bs)  # fmt: skip
            out["decode_tok_s"][str(bs)] = r["decode_tok_s"]
            if plain_tok_s.get(str(bs)):
                out["decode_vs_model_dtype"][str(bs)] = r["decode_tok_s"] / plain_tok_s[str(bs)]
            log(f"int8 kv: decode bs={bs} = {r['decode_tok_s']:.1f} tok/s")
        got = greedy_tokens(eng, prompts, agree_tokens)
    finally:
        free(eng)
    pairs = [agreement(a, b) for a, b in zip(ref, got, strict=True)]
    out["greedy_agreement"] = {
        "tokens": agree_tokens,
        "prompt_tokens": len(prompts[0]),
        "leading_equal": [p[0] for p in pairs],
        "fraction_equal": sum(p[1] for p in pairs) / len(pairs),
    }
    log(f"int8 kv: greedy leading-equal {out['greedy_agreement']['leading_equal']} of {agree_tokens}")
    return out
