"""Grammar engines on our vocabulary: xgrammar vs llguidance, tokenizer setup, schema compile and
per-token mask time (CPU), over a walk of a valid document's tokens.

`python -m ops.bench.grammar_engines [tokenizer.json]` (default: the demo artifact's tokenizer).
"""

# ruff: noqa: B023  (every lambda is called inside its loop iteration)
from __future__ import annotations

import glob
import json
import os
import sys
import time
from collections.abc import Callable

import torch

VOCAB = 248320  # the model's (padded) vocabulary
SCHEMAS: list[tuple[dict, object]] = [
    (
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        {"name": "Ada Lovelace", "age": 36},
    ),
    (
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                            "qty": {"type": "integer", "minimum": 1},
                            "tags": {"type": "array", "items": {"enum": ["new", "sale", "hot"]}},
                        },
                        "required": ["sku", "qty"],
                    },
                },
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
            "required": ["items", "note"],
        },
        {"items": [{"sku": "ABC-1234", "qty": 3, "tags": ["new", "hot"]}] * 4, "note": None},
    ),
]


def _hf(path: str):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=path)


def _timed(fn: Callable[[], object]) -> tuple[object, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _walk(fill: Callable[[], None], accept: Callable[[int], None], ids: list[int]) -> float:
    """Mean seconds of one mask fill along the document's tokens (the accept time excluded)."""
    total = 0.0
    for t in ids:
        t0 = time.perf_counter()
        fill()
        total += time.perf_counter() - t0
        accept(t)
    return total / len(ids)


def xgrammar_rows(path: str) -> list[str]:
    import xgrammar as xgr

    hf = _hf(path)
    info, setup = _timed(lambda: xgr.TokenizerInfo.from_huggingface(hf, vocab_size=VOCAB))
    comp = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    rows = [f"xgrammar: tokenizer info {setup * 1e3:.0f} ms"]
    for schema, doc in SCHEMAS:
        cg, dt = _timed(lambda: comp.compile_json_schema(json.dumps(schema), any_whitespace=False))
        m = xgr.GrammarMatcher(cg)
        mask = xgr.allocate_token_bitmask(1, VOCAB)
        ids = hf.encode(json.dumps(doc, separators=(",", ":")))
        per = _walk(lambda: m.fill_next_token_bitmask(mask), lambda t: m.accept_token(t), ids)
        logits = torch.randn(1, VOCAB)
        _, ap = _timed(lambda: xgr.apply_token_bitmask_inplace(logits, mask))
        rows.append(
            f"  compile {dt * 1e3:.1f} ms, mask {per * 1e6:.0f} us/token ({len(ids)} tokens), apply {ap * 1e6:.0f} us"
        )
    return rows


def llguidance_rows(path: str) -> list[str]:
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt

    hf = _hf(path)
    tok, setup = _timed(lambda: llguidance.hf.from_tokenizer(hf, n_vocab=VOCAB))
    rows = [f"llguidance: tokenizer {setup * 1e3:.0f} ms"]
    for schema, doc in SCHEMAS:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False}
        )
        m, dt = _timed(lambda: llguidance.LLMatcher(tok, grammar))
        mask = lt.allocate_token_bitmask(1, VOCAB)
        ids = hf.encode(json.dumps(doc, separators=(",", ":")))
        per = _walk(lambda: lt.fill_next_token_bitmask(m, mask, 0), lambda t: m.consume_token(t), ids)
        logits = torch.randn(1, VOCAB)
        _, ap = _timed(lambda: lt.apply_token_bitmask_inplace(logits, mask))
        rows.append(
            f"  compile {dt * 1e3:.1f} ms, mask {per * 1e6:.0f} us/token ({len(ids)} tokens), apply {ap * 1e6:.0f} us"
        )
    return rows


def main() -> None:
    default = glob.glob(os.path.expanduser("~/.cache/ninfer/demo-*.ninfer/tokenizer/tokenizer.json"))
    path = sys.argv[1] if len(sys.argv) > 1 else default[0]
    torch.set_num_threads(1)
    for fn in (xgrammar_rows, llguidance_rows):
        try:
            print("\n".join(fn(path)))
        except Exception as exc:  # one engine missing must not hide the other's figures
            print(f"{fn.__name__}: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
