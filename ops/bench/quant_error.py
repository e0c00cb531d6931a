"""Quantization error of a weight profile against the bf16 model its weights were encoded from.

One random bf16 model (the released shape's full width, its first `--layers` layers) is drawn on
the device; each profile's artifact recipe (`ninfer.artifact.profiles.plan`) encodes the same
tensors with the canonical encoders, and the quantized model is loaded through the engine's loader
(the quantized kernels run it). A fixed prompt set is teacher-forced through both: a prefill of all
but the last `STEPS` tokens (the tile-dequantizing GEMMs) and then one token per call (the decode
GEMVs). Per profile: top-1 agreement of the next-token argmax and the mean / max KL(bf16 || quant)
over every position.

The same figures between two equally valid bf16 computations of the same model (the prompt in
64-token chunks against one chunk) are reported as `bf16_noise`: a random model is chaotic, so
a figure near the noise says the format adds little beyond rounding. Random weights are not a
trained model's distribution: these are the formats' error on these shapes, not a model's quality.

    python ops/bench/quant_error.py --shape qwen3.6-27b --layers 4 --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ninfer.artifact import open_artifact, registry
from ninfer.artifact.profiles import PROFILES, plan
from ninfer.artifact.synth import synth_config, write_synthetic
from ninfer.formats.weight import QuantWeight, quantize
from ninfer.kernels.dispatch import get_ops
from ninfer.model.cache import KVPool, StatePool, make_batch
from ninfer.model.config import PAGE_SIZE, TextConfig
from ninfer.model.qwen35 import Qwen35Model
from ninfer.model.weights import load_model

STEPS = 16  # teacher-forced single-token calls at the end of each prompt (the decode path)


def bf16_tensors(cfg: TextConfig, model_id: str, seed: int, device: str) -> dict[str, torch.Tensor]:
    """The text model's canonical tensors, drawn on `device` as a synthetic bf16 artifact loads them."""
    ident = registry.lookup(model_id)
    assert ident is not None, model_id
    with tempfile.TemporaryDirectory() as tmp:
        path = write_synthetic(Path(tmp) / "qe.ninfer", cfg, ident, seed=seed, label="qe", display="qe")
        return dict(open_artifact(path).load_tensors("text", device=device))


def encode_profile(
    tensors: dict[str, torch.Tensor], profile: str, cfg: TextConfig, model_id: str
) -> dict[str, torch.Tensor | QuantWeight]:
    """The same tensors as `profile` stores them: each encoded (or split, then encoded) per the recipe."""
    out: dict[str, torch.Tensor | QuantWeight] = {}
    for name, t in tensors.items():
        start = 0
        for p in plan(profile, cfg, model_id, name, tuple(t.shape)):
            part = t if p.whole is None else t[start : start + p.shape[0]]
            start += p.shape[0]
            out[p.name] = part if p.fmt is None else quantize(part, p.fmt)
    return out


def teacher_forced_logits(
    model: Qwen35Model, ids: list[int], chunk: int, device: str, steps: int = STEPS
) -> torch.Tensor:
    """float32 next-token logits [len(ids), V]: prefill calls of `chunk` tokens over all but the last
    `steps` tokens, then one call per token."""
    cfg = model.config
    pages = -(-len(ids) // PAGE_SIZE) + 1
    kv = KVPool.for_config(cfg, pages, torch.bfloat16, device)
    st = StatePool.for_config(cfg, 1, torch.bfloat16, device)
    cut = len(ids) - steps
    calls = [(s, min(chunk, cut - s)) for s in range(0, cut, chunk)] + [(s, 1) for s in range(cut, len(ids))]
    outs = []
    with torch.inference_mode():
        for start, n in calls:
            batch = make_batch([ids[start : start + n]], [start], [0], [list(range(pages))], pages, device)
            outs.append(model.logits(model(batch, kv, st)[0]).float())  # [n, V]
    return torch.cat(outs)


def compare(ref: torch.Tensor, other: torch.Tensor) -> dict[str, float]:
    """ref, other [n, V] logits -> top-1 agreement and KL(ref || other) per position (mean, max)."""
    lp, lq = torch.log_softmax(ref, -1), torch.log_softmax(other, -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)  # [n]
    return {
        "top1_agree": float((ref.argmax(-1) == other.argmax(-1)).float().mean()),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
    }


def measure(
    cfg: TextConfig,
    model_id: str,
    profiles: list[str],
    *,
    device: str,
    backend: str | None = None,
    prompts: int = 4,
    tokens: int = 256,
    seed: int = 0,
) -> dict[str, Any]:
    """Quantization error of each profile against the bf16 model of `cfg` (see the module doc)."""
    ops = get_ops(torch.device(device).type, backend)
    cfg = dataclasses.replace(cfg, mtp_num_hidden_layers=0)
    dense = bf16_tensors(cfg, model_id, seed, device)
    gen = torch.Generator().manual_seed(seed + 7)
    vocab = min(cfg.vocab_size, 240_000)
    prompt_set = [torch.randint(0, vocab, (tokens,), generator=gen).tolist() for _ in range(prompts)]
    ref_model = load_model(cfg, dense, torch.bfloat16, device, ops=ops)
    ref = [teacher_forced_logits(ref_model, ids, tokens, device) for ids in prompt_set]
    chunked = [teacher_forced_logits(ref_model, ids, 64, device) for ids in prompt_set]
    del ref_model
    out: dict[str, Any] = {
        "layers": cfg.num_hidden_layers,
        "prompts": prompts,
        "tokens_per_prompt": tokens,
        "decode_steps_per_prompt": STEPS,
        "bf16_noise": compare(torch.cat(ref), torch.cat(chunked)),
        "profiles": {},
    }
    for profile in profiles:
        model = load_model(
            cfg, encode_profile(dense, profile, cfg, model_id), torch.bfloat16, device, ops=ops
        )
        got = [teacher_forced_logits(model, ids, tokens, device) for ids in prompt_set]
        out["profiles"][profile] = compare(torch.cat(ref), torch.cat(got))
        del model, got
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    import json

    from ops.bench.report import provenance, write_json

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3.6-27b")
    p.add_argument(
        "--layers", type=int, default=4, help="the first N layers of the shape (4: 3 GDN + 1 attention)"
    )
    p.add_argument(
        "--profiles", default="groupwise-int,fp8", help=f"comma-separated, of {', '.join(PROFILES)}"
    )
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    cfg = synth_config(args.shape, args.layers, mtp=False)
    res = measure(cfg, args.shape, args.profiles.split(","), device=args.device, prompts=args.prompts,
                  tokens=args.tokens)  # fmt: skip
    meta = provenance("ops/bench/quant_error.py", list(sys.argv[1:] if argv is None else argv))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{meta['date'][:10]}-{meta['commit']}-quant-error-{args.shape}.json"
    write_json(path, {**meta, "shape": args.shape, **res})
    print(json.dumps(res["profiles"] | {"bf16_noise": res["bf16_noise"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
