"""Grammar-constrained decoding's cost on a full-size artifact: mask overhead and compile time.

    python ops/bench/grammar_overhead.py ARTIFACT --model qwen3.6-27b --out DIR [--smoke] [-- server flags]

Builds the engine the server builds (`ninfer.bootstrap.build_engine`, same flags as `ninfer-serve`),
then times decode of 8 requests at once (greedy, thinking off, ignored EOS) unconstrained and with
every row constrained by a JSON schema whose answer runs long (one string), and reports the
constrained step's overhead: 1 - constrained tok/s / unconstrained tok/s (decode only: each
request's decode seconds over its tokens after the first). A constrained row's logits wait for its
mask (filled on the host while the step runs), and such rows are not launched ahead. It also
times each schema's first compilation (and the cached second) over a few schema kinds. On a
synthetic artifact (`python -m ninfer.artifact synth`) the weights are random: the sampled text
means nothing, the step time is the real one. `--smoke` runs it small on the CPU (the test suite).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ninfer.artifact import open_artifact
from ninfer.bootstrap import build_engine
from ninfer.config.loader import load_settings
from ninfer.engine.types import ConstraintSpec, GenerationRequest, SamplingParams
from ninfer.service.cli import translate
from ops.bench.report import artifact_args, provenance, write_json

# the timed rows' answer: one JSON string, which random weights rarely close (the rows stay alive)
LONG_ANSWER = {"type": "string"}
SCHEMAS: dict[str, dict[str, Any]] = {
    "flat_object": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["name", "age"],
    },
    "nested_arrays": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 5,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "tags": {"type": "array", "items": {"type": "string"}},
                    },
                },
            }
        },
        "required": ["items"],
    },
    "enum_anyof": {
        "anyOf": [
            {"type": "object", "properties": {"kind": {"enum": ["a", "b", "c"]}}, "required": ["kind"]},
            {"type": "array", "items": {"type": "number"}},
        ]
    },
    "pattern_format": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "when": {"type": "string", "format": "date"},
        },
        "required": ["code", "when"],
    },
    "recursive_ref": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
            }
        },
        "$ref": "#/$defs/node",
    },
}


def _spec(schema: dict[str, Any]) -> ConstraintSpec:
    return ConstraintSpec("json_schema", json.dumps(schema), param="response_format")


def _decode_tok_s(engine: Any, rows: int, tokens: int, spec: ConstraintSpec | None, salt: int) -> float:
    """Decode tok/s of `rows` requests submitted together (after each one's first token)."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    prompts = [
        tuple((salt * 7919 + i * 104729 + j * 31) % 50_000 + 10 for j in range(32)) for i in range(rows)
    ]
    handles = [
        engine.submit(
            engine.reserve(), GenerationRequest(f"g{salt}-{i}", p, params, thinking=False, constraint=spec)
        )
        for i, p in enumerate(prompts)
    ]
    steps, seconds = 0, 0.0
    for h in handles:
        with h:
            got, _ = h.result(3600)
        steps += max(0, len(got) - 1)
        seconds = max(seconds, h.stats.decode_s)
    return steps / seconds if seconds else 0.0


def main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    p, own, server = artifact_args(__doc__, raw)
    args = p.parse_args(own)
    flags = server or ["--max-concurrency", "8", "--max-context", "4096"]
    rows, tokens, repeats = (2, 4, 1) if args.smoke else (8, 128, 3)
    result: dict[str, Any] = {**provenance("ops/bench/grammar_overhead.py", raw), "model": args.model,
                              "server_flags": flags, "rows": rows, "tokens": tokens}  # fmt: skip
    engine = build_engine(
        load_settings(translate([args.artifact, *flags])), open_artifact(args.artifact)
    ).start()
    try:
        engine.wait_ready()
        grammars = engine.grammars
        if grammars is None:
            raise SystemExit("this engine cannot constrain output (no tokenizer)")
        grammars.build_tables()  # built already where the engine warmed up; its own timing either way
        assert grammars.tables_s is not None, "the grammar tables were not built"
        result["tokenizer_tables_s"] = round(grammars.tables_s, 3)
        compile_ms: dict[str, dict[str, float]] = {}
        for name, schema in SCHEMAS.items():
            t0 = time.perf_counter()
            grammars.compiled(_spec(schema))
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            grammars.compiled(_spec(schema))
            compile_ms[name] = {
                "first": round(first * 1e3, 3),
                "cached": round((time.perf_counter() - t0) * 1e3, 3),
            }
        result["compile_ms"] = compile_ms
        long = _spec(LONG_ANSWER)
        if not args.smoke:  # warm rounds of both kinds, not timed (nothing compiles on the CPU)
            _decode_tok_s(engine, rows, tokens, None, 0)
            _decode_tok_s(engine, rows, tokens, long, 1)
        plain = [_decode_tok_s(engine, rows, tokens, None, 10 + i) for i in range(repeats)]
        masked = [_decode_tok_s(engine, rows, tokens, long, 20 + i) for i in range(repeats)]
        result["decode_tok_s"] = {
            "plain": round(statistics.median(plain), 2),
            "constrained": round(statistics.median(masked), 2),
        }
        result["mask_overhead"] = round(1 - statistics.median(masked) / statistics.median(plain), 4)
        result["late_compiles"] = engine.late_compiles()
    finally:
        engine.shutdown(5.0)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{result['date'][:10]}-{result['commit']}-grammar-{args.model}.json"
    write_json(path, result)
    print(json.dumps({k: result[k] for k in ("decode_tok_s", "mask_overhead", "compile_ms")}))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
