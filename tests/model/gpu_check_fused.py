"""GPU check (not collected by pytest): fused vs unfused projections on real-width random models.

Run on a CUDA machine from the repo root:  PYTHONPATH=. python3 tests/model/gpu_check_fused.py
Per model (27B width: 3 GDN + 1 attention layer; 35B-A3B width: 1 + 1, 256 experts) and per
`linear` (the backend's, cuBLAS F.linear): the max relative logit difference fused vs unfused over
prefill, batched decode and verify (q = 4) against the unfused model's own bf16 noise (triton vs
reference ops), a CUDA-graph capture of the fused decode step, and graph-replay step times.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import torch
import torch.nn.functional as F

from ninfer.kernels.dispatch import Ops, get_ops
from ninfer.model.cache import KVPool, StatePool, make_batch
from ninfer.model.config import DENSE, FULL, LINEAR, MOE, TextConfig
from ninfer.model.qwen35 import Qwen35Model
from ops.bench.shapes import init_random_

DEV = "cuda"
WIDTHS = {
    "27b": dict(family=DENSE, hidden_size=5120, num_attention_heads=24, num_key_value_heads=4,
                linear_num_key_heads=16, linear_num_value_heads=48, intermediate_size=17408,
                layer_types=(LINEAR, LINEAR, LINEAR, FULL)),
    "35b-a3b": dict(family=MOE, hidden_size=2048, num_attention_heads=16, num_key_value_heads=2,
                    linear_num_key_heads=16, linear_num_value_heads=32, num_experts=256, num_experts_per_tok=8,
                    moe_intermediate_size=512, shared_expert_intermediate_size=512, layer_types=(LINEAR, FULL)),
}  # fmt: skip


def build(name: str, ops: Ops) -> Qwen35Model:
    w = dict(WIDTHS[name])
    types = w.pop("layer_types")
    cfg = TextConfig(vocab_size=4096, num_hidden_layers=len(types), layer_types=types, head_dim=256,
                     linear_key_head_dim=128, linear_value_head_dim=128, **w)  # fmt: skip
    with torch.device(DEV):
        model = Qwen35Model(cfg, ops)
    init_random_(model, torch.Generator(device=DEV).manual_seed(0))
    model = model.to(torch.bfloat16).eval().requires_grad_(False)
    model.init_buffers(DEV)
    return model


def phases(model: Qwen35Model) -> torch.Tensor:
    cfg = model.config
    ids = torch.randint(0, 4096, (2, 120), generator=torch.Generator().manual_seed(1)).tolist()
    kv = KVPool.for_config(cfg, 6, torch.bfloat16, DEV)
    st = StatePool.for_config(cfg, 6, torch.bfloat16, DEV)
    pages = [[4, 1], [0, 5]]
    out = []
    with torch.inference_mode():
        for b in range(2):
            batch = make_batch([ids[b][:100]], [0], [b], [pages[b]], device=DEV)
            out.append(model.logits(model(batch, kv, st))[0])
        batch = make_batch([[ids[0][100]], [ids[1][100]]], [100, 100], [0, 1], pages, device=DEV)
        out.append(model.logits(model(batch, kv, st)).flatten(0, 1))
        batch = make_batch([ids[0][101:105], ids[1][101:105]], [101, 101], [0, 1], pages, device=DEV,
                           write_slots=[[2, 3, -1, 4], [5, -1, -1, -1]])  # fmt: skip
        out.append(model.logits(model(batch, kv, st)).flatten(0, 1))
    return torch.cat(out)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def graph_step_ms(model: Qwen35Model, bs: int) -> tuple[float, float]:
    """(ms per CUDA-graph replay of a q = 1 decode step at 2K context, max |replay - eager| logits)."""
    cfg = model.config
    kv = KVPool.for_config(cfg, 33 * bs, torch.bfloat16, DEV)
    st = StatePool.for_config(cfg, bs, torch.bfloat16, DEV)
    pages = [list(range(33 * b, 33 * b + 33)) for b in range(bs)]
    batch = make_batch([[7]] * bs, [2048] * bs, list(range(bs)), pages, device=DEV)
    with torch.inference_mode():
        eager = model.logits(model(batch, kv, st))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                model.logits(model(batch, kv, st))
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = model.logits(model(batch, kv, st))
        g.replay()
        torch.cuda.synchronize()
        diff = (out - eager).abs().max().item()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(50):
            g.replay()
        t1.record()
        torch.cuda.synchronize()
    return t0.elapsed_time(t1) / 50, diff


def main() -> None:
    res: dict[str, object] = {}
    triton, ref = get_ops("cuda", "triton"), get_ops("cuda", "reference")
    for name in WIDTHS:
        for lin_name, ops in (("backend", triton), ("cublas", dataclasses.replace(triton, linear=F.linear))):
            key = f"{name}/{lin_name}"
            try:
                unfused = build(name, ops)
                fused = copy.deepcopy(unfused)
                fused.fuse_projections()
                a, b = phases(unfused), phases(fused)
                unfused.set_ops(ref)
                noise = rel(phases(unfused), a)  # the same weights on the reference ops
                unfused.set_ops(ops)
                r: dict[str, object] = {"rel_fused_vs_unfused": rel(b, a), "rel_reference_vs_triton": noise}
                for bs in (1, 8):
                    (tu, _), (tf, d) = graph_step_ms(unfused, bs), graph_step_ms(fused, bs)
                    r[f"graph_step_ms_bs{bs}"] = {"unfused": tu, "fused": tf, "fused_replay_vs_eager": d}
                res[key] = r
                del unfused, fused
                torch.cuda.empty_cache()
            except Exception as exc:  # report and go on with the next variant
                res[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            print(key, json.dumps(res[key]), flush=True)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
