"""CPU engine throughput: decode tokens/s at batch 1 and batch 8 (printed, not asserted).

python ops/bench/cpu_throughput.py                 # the demo architecture, random weights
python ops/bench/cpu_throughput.py --artifact X    # a converted .ninfer artifact
"""

from __future__ import annotations

import argparse
import time

import torch

from ninfer.artifact.demo import demo_config
from ninfer.artifact.shapes import text_shapes
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.types import GenerationRequest, SamplingParams
from ninfer.model.weights import load_model


def _random_model(seed: int = 0) -> torch.nn.Module:
    cfg = demo_config()
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in text_shapes(cfg).items():
        if name.endswith("A_log"):
            t = torch.empty(shape).uniform_(1.0, 16.0, generator=g).log_()
        elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            t = 0.02 * torch.randn(shape, generator=g)
        tensors[name] = t
    return load_model(cfg, tensors, torch.float32, "cpu")


def _load(artifact: str | None) -> torch.nn.Module:
    if artifact is None:
        return _random_model()
    from ninfer.artifact import open_artifact

    art = open_artifact(artifact)
    return load_model(art.config, art.load_tensors("text"), torch.float32, "cpu")


def run(model: torch.nn.Module, batch: int, prompt_len: int, new_tokens: int) -> None:
    cfg = EngineConfig(
        max_concurrency=batch,
        max_context=prompt_len + new_tokens + 64,
        kv_capacity=batch * (prompt_len + new_tokens + 64),
        prefill_chunk=512,
        no_prefix_reuse=True,
    )
    eng = Engine(model, cfg).start()
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    reqs = [
        GenerationRequest(
            f"b{i}", tuple((j * 7919 + i * 104729) % 200_000 + 10 for j in range(prompt_len)), params
        )
        for i in range(batch)
    ]
    t0 = time.perf_counter()
    handles = [eng.submit(eng.reserve(), r) for r in reqs]
    for h in handles:
        h.result(3600)
        h.close()
    wall = time.perf_counter() - t0
    c = eng.counters.total
    eng.shutdown(5)
    decode_tps = c.decode_tokens / c.decode_seconds if c.decode_seconds else float("nan")
    prefill_tps = c.prefill_tokens / c.prefill_seconds if c.prefill_seconds else float("nan")
    print(
        f"batch={batch}: decode {decode_tps:8.1f} tok/s (avg batch {c.decode_row_rounds / max(c.decode_rounds, 1):.2f}), "
        f"prefill {prefill_tps:8.1f} tok/s, wall {wall:.2f}s for {batch * new_tokens} new tokens"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", default=None)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = _load(args.artifact)
    for batch in (1, 8):
        run(model, batch, args.prompt_len, args.new_tokens)


if __name__ == "__main__":
    main()
