"""Short prefills eager vs through the captured prefill graphs, on a synthetic artifact (GPU).

    python ops/bench/prefill_graphs.py --shape qwen3.6-35b-a3b --layers 10 --out DIR

Times the TTFT of one ~40-token prompt (max_tokens 1) through the engine with the prefill graphs
off, on with one request per replay, and on with the prompts that arrive together in one replay;
the largest TTFT of 8 such prompts submitted together (`burst8`); and the greedy tokens of a few
prompts each way (bf16: the graph runs the recurrent GDN step, eager the chunked rule, so rounding
may differ; reported, not asserted).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from ninfer.artifact import open_artifact
from ninfer.artifact.synth import synth
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.types import GenerationRequest, SamplingParams
from ninfer.model.weights import load_model
from ops.bench.report import provenance, write_json


def _run(engine: Engine, prompt: tuple[int, ...], max_tokens: int) -> tuple[list[int], float]:
    h = engine.submit(
        engine.reserve(),
        GenerationRequest(
            "p", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        ),
    )
    with h:
        tokens, _ = h.result(600)
    return tokens, h.stats.ttft_s


def _burst(engine: Engine, prompts: list[tuple[int, ...]]) -> float:
    """The largest TTFT (s) of prompts submitted together (max_tokens 1)."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    handles = [
        engine.submit(engine.reserve(), GenerationRequest(f"b{i}", p, params)) for i, p in enumerate(prompts)
    ]
    for h in handles:
        with h:
            h.result(600)
    return max(h.stats.ttft_s for h in handles)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="qwen3.6-35b-a3b")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    path = synth(Path(tempfile.mkdtemp()) / "a.ninfer", args.shape, layers=args.layers, mtp=False)
    art = open_artifact(path)
    model = load_model(art.config, art.load_tensors("text", device="cuda"), torch.bfloat16, "cuda")
    base = EngineConfig(
        max_concurrency=8,
        max_pending=8,
        max_context=4096,
        device="cuda",
        dtype="bfloat16",
        prefill_warmup=False,
    )
    prompts = [
        tuple((i * 7919 + j * 104729) % 240000 + 10 for j in range(n))
        for i, n in enumerate((5, 33, 40, 47, 70))
    ]
    result: dict = {
        **provenance("ops/bench/prefill_graphs.py", sys.argv[1:]),
        "shape": args.shape,
        "layers": args.layers,
    }
    outs = {}
    burst = [tuple((i * 6007 + j * 104729) % 240000 + 10 for j in range(36 + i)) for i in range(8)]
    runs = (("eager", (), None), ("graphs_one_row", base.prefill_graph_buckets, 1),
            ("graphs", base.prefill_graph_buckets, None))  # fmt: skip
    for name, buckets, rows in runs:
        engine = Engine(model, replace(base, prefill_graph_buckets=buckets, prefill_graph_rows=rows)).start()
        engine.wait_ready()
        stats = engine.runner.graph_stats
        toks = [_run(engine, pr, 16)[0] for pr in prompts]
        ttft = []
        for _ in range(8):
            ttft.append(_run(engine, prompts[2], 1)[1])
        bursts = [_burst(engine, burst) for _ in range(4)]
        engine.shutdown(5.0)
        outs[name] = toks
        result[name] = {
            "ttft_ms_40_tokens": {
                "median": round(statistics.median(ttft[2:]) * 1e3, 2),
                "min": round(min(ttft) * 1e3, 2),
            },
            "burst8_max_ttft_ms": {"median": round(statistics.median(bursts[1:]) * 1e3, 2)},
            "prefill_buckets": None if stats is None else stats.prefill_buckets,
            "prefill_shapes": None if stats is None else stats.prefill_shapes,
            "prefill_error": None if stats is None else stats.prefill_error,
            "prefill_capture_s": None if stats is None else round(stats.prefill_capture_s, 2),
        }
        print(name, result[name], flush=True)
    result["greedy_equal"] = [a == b for a, b in zip(outs["eager"], outs["graphs"], strict=True)]
    result["greedy_equal_rows"] = [
        a == b for a, b in zip(outs["graphs_one_row"], outs["graphs"], strict=True)
    ]
    result["greedy_first_diff"] = [
        next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        for a, b in zip(outs["eager"], outs["graphs"], strict=True)
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"{result['date'][:10]}-{result['commit']}-prefill-graphs-{args.shape}.json"
    write_json(out, result)
    print(result, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
