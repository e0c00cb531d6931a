"""GPU check (not collected by pytest): "triton" backend vs "reference" on real-width random models.

Run on a CUDA machine from the repo root (fla-core importable for the fla prefill path):
    python tests/kernels/gpu_check_model.py [--out results.json]
Builds a 27B-width dense model (GDN, GDN, attention) and a 35B-A3B-width MoE model (GDN,
attention; 256 experts, top-8), and for bf16 and int8 KV prints the max relative logit error
(max |a-b| / max |b|) of the triton backend against the reference backend per phase: chunked
prefill (fla) with history, batched decode (q=1), verify (q=4, per-token state slots), plus the
MoE op variants, CUDA-graph capture/replay of decode and verify (no host syncs) and timings.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable

import torch

from ninfer.kernels import gdn_ref, get_ops
from ninfer.kernels.moe_grouped import moe_experts_gathered, moe_experts_grouped
from ninfer.kernels.moe_ref import moe_experts
from ninfer.model.cache import KVPool, StatePool, make_batch
from ninfer.model.config import DENSE, FULL, LINEAR, MOE, TextConfig
from ninfer.model.qwen35 import Qwen35Model

DEV = torch.device("cuda")
RESULTS: dict[str, object] = {}

WIDTHS = {
    "27b": dict(family=DENSE, hidden_size=5120, num_attention_heads=24, num_key_value_heads=4,
                linear_num_key_heads=16, linear_num_value_heads=48, intermediate_size=17408,
                layer_types=(LINEAR, LINEAR, FULL)),
    "35b-a3b": dict(family=MOE, hidden_size=2048, num_attention_heads=16, num_key_value_heads=2,
                    linear_num_key_heads=16, linear_num_value_heads=32, num_experts=256,
                    num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                    layer_types=(LINEAR, FULL)),
}  # fmt: skip


def config(name: str) -> TextConfig:
    w = dict(WIDTHS[name])
    types = w.pop("layer_types")
    return TextConfig(vocab_size=4096, num_hidden_layers=len(types), layer_types=types, head_dim=256,
                      linear_key_head_dim=128, linear_value_head_dim=128, **w)  # fmt: skip


def random_model(cfg: TextConfig) -> Qwen35Model:
    gen = torch.Generator(device=DEV).manual_seed(0)
    with torch.device(DEV):
        model = Qwen35Model(cfg, get_ops("cuda", "reference"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.01, 4, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen, device=DEV) * 0.5)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + torch.randn(p.shape, generator=gen, device=DEV) * 0.2)
            elif "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen, device=DEV) * 0.2)
            elif name.endswith("conv1d.weight"):
                p.copy_(torch.randn(p.shape, generator=gen, device=DEV) * 0.3)
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=gen, device=DEV))
            else:
                p.copy_(torch.randn(p.shape, generator=gen, device=DEV) * 0.7 / p.shape[-1] ** 0.5)
    model = model.to(torch.bfloat16).eval()
    model.init_buffers(DEV)  # rope tables in fp32, after the cast
    return model


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()


def pools(cfg: TextConfig, kv_dtype: str) -> tuple[KVPool, StatePool]:
    kv = KVPool.for_config(cfg, 16, torch.bfloat16, DEV, kv_dtype=kv_dtype)
    return kv, StatePool.for_config(cfg, 12, torch.bfloat16, DEV)


def all_pool_tensors(kv: KVPool, st: StatePool) -> list[torch.Tensor]:
    return [*kv.k, *kv.v, *kv.k_scale, *kv.v_scale, *st.conv, *st.ssm]


PAGES = [[5, 2, 9, 0, 14, 7], [1, 11, 3, 8]]
IDS = torch.randint(0, 4096, (2, 320), generator=torch.Generator().manual_seed(1)).tolist()
LENS = (300, 170)  # prompt lengths; prefill in chunks of 200 + rest (the second chunk has history)


def phases(model: Qwen35Model, kv: KVPool, st: StatePool) -> dict[str, torch.Tensor]:
    """Prefill both sequences (slots 0, 1), decode 3 steps (q=1), verify q=4 into slots 2..9."""
    out: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        rows = []
        for b, n in enumerate(LENS):
            for lo, hi in ((0, 200), (200, n)):
                if hi <= lo:
                    continue
                batch = make_batch([IDS[b][lo:hi]], [lo], [b], [PAGES[b]], device=DEV)
                rows.append(model.logits(model(batch, kv, st))[0])
        out["prefill"] = torch.cat(rows)
        dec = []
        for t in range(3):
            batch = make_batch([[IDS[b][n + t]] for b, n in enumerate(LENS)], [n + t for n in LENS], [0, 1],
                               PAGES, device=DEV)  # fmt: skip
            dec.append(model.logits(model(batch, kv, st)))
        out["decode"] = torch.cat(dec, 1)
        batch = make_batch([IDS[b][n + 3 : n + 7] for b, n in enumerate(LENS)], [n + 3 for n in LENS], [0, 1],
                           PAGES, device=DEV, write_slots=[[2, 3, 4, 5], [6, 7, 8, 9]])  # fmt: skip
        out["verify"] = model.logits(model(batch, kv, st))
        out["ssm_after_verify"] = torch.stack([s[2:10] for s in st.ssm])
    return out


def compare_backends(name: str, model: Qwen35Model, triton_ops) -> None:
    cfg = model.config
    res: dict[str, object] = {}
    logits = {}
    for kv_dtype in ("bf16", "int8"):
        runs = {}
        for backend, ops in (("reference", get_ops("cuda", "reference")), ("triton", triton_ops)):
            model.set_ops(ops)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            runs[backend] = phases(model, *pools(cfg, kv_dtype))
            torch.cuda.synchronize()
            res[f"{kv_dtype}/{backend}_seconds"] = round(time.perf_counter() - t0, 3)
        for phase in runs["triton"]:
            a, b = runs["triton"][phase], runs["reference"][phase]
            res[f"{kv_dtype}/{phase}/rel_err"] = rel(a, b)
            if phase != "ssm_after_verify":
                res[f"{kv_dtype}/{phase}/argmax_agree"] = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
        logits[kv_dtype] = runs["triton"]
    for phase in ("prefill", "decode", "verify"):
        res[f"int8_vs_bf16_triton/{phase}/rel_err"] = rel(logits["int8"][phase], logits["bf16"][phase])
        agree = (logits["int8"][phase].argmax(-1) == logits["bf16"][phase].argmax(-1)).float().mean().item()
        res[f"int8_vs_bf16_triton/{phase}/argmax_agree"] = agree
    RESULTS[f"{name}/backends"] = res
    print(name, json.dumps(res, indent=1), flush=True)


def graph_check(name: str, model: Qwen35Model, triton_ops, q: int) -> None:
    """Capture one decode (q=1) or verify (q=4) step in a CUDA graph; replay == eager; timings."""
    cfg = model.config
    model.set_ops(triton_ops)
    kv, st = pools(cfg, "bf16")
    phases(model, kv, st)  # fill history (and compile every kernel)
    toks = [[IDS[b][n + 7 + i] for i in range(q)] for b, n in enumerate(LENS)]
    writes = [[2, 3, 4, 5][:q], [6, 7, 8, 9][:q]] if q > 1 else None
    batch = make_batch(toks, [n + 7 for n in LENS], [0, 1], PAGES, device=DEV, write_slots=writes)
    batch.max_kv_len = None  # static shapes

    def step() -> torch.Tensor:
        return model.logits(model(batch, kv, st))

    tensors = all_pool_tensors(kv, st)
    snap = [t.clone() for t in tensors]
    with torch.inference_mode():
        eager = step()
        after = [t.clone() for t in tensors]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = step()
        for t, s in zip(tensors, snap, strict=True):
            t.copy_(s)
        graph.replay()
        torch.cuda.synchronize()
        res = {"logits_rel_err": rel(static, eager),
               "pools_max_rel_err": max(rel(t, a) for t, a in zip(tensors, after, strict=True) if a.abs().max() > 0)}  # fmt: skip
        for label, fn in (("eager_ms", step), ("graph_ms", graph.replay)):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            res[label] = round((time.perf_counter() - t0) / 20 * 1e3, 3)
    RESULTS[f"{name}/graph_q{q}"] = res
    print(name, f"graph q={q}", res, flush=True)


def moe_check() -> None:
    cfg = config("35b-a3b")
    gen = torch.Generator(device=DEV).manual_seed(3)
    e, h, ie, k = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    gate_up = (torch.randn(e, 2 * ie, h, generator=gen, device=DEV) / h**0.5).bfloat16()
    down = (torch.randn(e, h, ie, generator=gen, device=DEV) / ie**0.5).bfloat16()
    res: dict[str, object] = {}
    for n in (1, 4, 300):
        x = torch.randn(n, h, generator=gen, device=DEV).bfloat16()
        w, idx = torch.randn(n, e, generator=gen, device=DEV).softmax(-1).topk(k, -1)
        w = (w / w.sum(-1, keepdim=True)).bfloat16()
        ref = moe_experts(x, gate_up, down, idx, w)
        fns: dict[str, Callable] = {"grouped": moe_experts_grouped, "gathered": moe_experts_gathered}
        args = (x, gate_up, down, idx, w)
        for label, fn in fns.items():
            if label == "gathered" and n > 64:
                continue
            try:
                res[f"n{n}/{label}/rel_err"] = rel(fn(*args), ref)
                res[f"n{n}/{label}/ms"] = round(timed(lambda fn=fn, args=args: fn(*args)), 4)
            except Exception as err:  # report and continue
                res[f"n{n}/{label}/error"] = f"{type(err).__name__}: {err}"[:300]
        res[f"n{n}/reference/ms"] = round(timed(lambda args=args: moe_experts(*args)), 4)
    RESULTS["moe_ops"] = res
    print("moe", json.dumps(res, indent=1), flush=True)


def timed(fn: Callable[[], object], reps: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def guarded(label: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as err:  # one failing check must not hide the others
        traceback.print_exc()
        RESULTS[f"{label}/error"] = f"{type(err).__name__}: {err}"[:500]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    triton_ops = get_ops("cuda")
    RESULTS["backend"] = triton_ops.name
    RESULTS["fla_prefill"] = triton_ops.chunk_gated_delta_rule is not gdn_ref.chunk_gated_delta_rule
    RESULTS["versions"] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    print(RESULTS, flush=True)
    guarded("moe_ops", moe_check)
    for name in ("35b-a3b", "27b"):
        model = random_model(config(name))
        guarded(f"{name}/backends", lambda model=model, name=name: compare_backends(name, model, triton_ops))
        for q in (1, 4):
            guarded(
                f"{name}/graph_q{q}",
                lambda model=model, name=name, q=q: graph_check(name, model, triton_ops, q),
            )
        del model
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(RESULTS, f, indent=1)


if __name__ == "__main__":
    main()
