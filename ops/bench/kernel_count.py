"""Device kernels one decode step launches, counted at the dispatcher (works on the CPU interpreter).

Usage (from the repository root; on the CPU the Triton kernels run under TRITON_INTERPRET=1):

    TRITON_INTERPRET=1 python ops/bench/kernel_count.py [--backend triton] [--batch 1] [--by-op]

Every aten op that is not a view, an allocation or metadata counts as one kernel, and every Triton
launch as one. A GPU runs about the same number (a cuBLAS split-K GEMM adds a reduction kernel, a
few torch ops launch two), so the count transfers to the H200 profile. Small random models with
one block of each layer kind are counted; the per-layer counts give the full-depth models'
counts (27B: 48 GDN + 16 attention layers, 35B-A3B: 30 + 10). The models' projections are fused
as on CUDA (`Qwen35Model.fuse_projections`); --unfused counts the separate projections.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# ops that launch no device kernel: allocation, views, metadata
_NO_KERNEL = {
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "detach",
    "alias",
    "lift_fresh",
    "_unsafe_view",
    "_reshape_alias",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "is_same_size",
    "record_stream",
    "promote_types",
}
FULL_DEPTH = {"qwen3.6-27b": (48, 16, "dense"), "qwen3.6-35b-a3b": (30, 10, "moe")}


class _CountMode(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.in_launch = 0  # > 0 inside a Triton launch (the interpreter's own argument copies)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        ns = func.namespace
        if ns == "aten" and not func.is_view and name not in _NO_KERNEL and not self.in_launch:
            self.ops[f"aten.{name}"] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _count_triton(mode: _CountMode) -> Iterator[None]:
    """Count Triton launches (interpreted or compiled) by kernel name."""
    patched: list[tuple[type, Callable]] = []
    classes: list[type] = []
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        classes = [InterpretedFunction, JITFunction]
    except ImportError:
        pass
    for cls in classes:
        original = cls.run

        def run(self, *args, _orig=original, **kwargs):
            if not kwargs.get("warmup", False) and not mode.in_launch:
                mode.ops[f"triton.{getattr(self, '__name__', None) or self.fn.__name__}"] += 1
            mode.in_launch += 1
            try:
                return _orig(self, *args, **kwargs)
            finally:
                mode.in_launch -= 1

        cls.run = run
        patched.append((cls, original))
    try:
        yield
    finally:
        for cls, original in patched:
            cls.run = original


def count_kernels(fn: Callable[[], object]) -> Counter[str]:
    """Kernels `fn()` launches, by op name (aten.* and triton.*)."""
    mode = _CountMode()
    with _count_triton(mode), mode:
        fn()
    return mode.ops


def small_config(kind: str, layer_types: tuple[str, ...]):
    from ninfer.model.config import DENSE, MOE, TextConfig

    extra = (
        dict(family=DENSE, intermediate_size=96)
        if kind == "dense"
        else dict(
            family=MOE,
            num_experts=16,
            num_experts_per_tok=4,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
    )
    return TextConfig(vocab_size=256, hidden_size=64, num_hidden_layers=len(layer_types),
                      layer_types=layer_types, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                      linear_value_head_dim=16, mrope_section=(2, 1, 1), **extra)  # fmt: skip


def decode_step_counts(
    kind: str, layer_types: tuple[str, ...], backend: str, batch: int, fuse: bool = True
) -> Counter[str]:
    """Kernels of one q = 1 decode step (model forward + final norm + lm_head) of `batch` rows."""
    from ninfer.kernels.dispatch import get_ops
    from ninfer.model.cache import KVPool, StatePool, make_batch
    from ninfer.model.qwen35 import Qwen35Model

    cfg = small_config(kind, layer_types)
    torch.manual_seed(0)
    model = Qwen35Model(cfg, get_ops("cuda" if backend != "reference" else "cpu", backend))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    model = model.to(torch.bfloat16)  # the model dtype decides which casts are real kernels
    model.set_ops(model.ops)
    model.init_buffers("cpu")
    if fuse:
        model.fuse_projections()
    kv = KVPool.for_config(cfg, 2 * batch, torch.bfloat16, "cpu")
    st = StatePool.for_config(cfg, batch, torch.bfloat16, "cpu")
    pages = [[2 * b, 2 * b + 1] for b in range(batch)]
    step = make_batch([[1]] * batch, [5] * batch, list(range(batch)), pages)
    with torch.no_grad():
        model(step, kv, st)  # warm-up (Triton interpreter rewrite, lazy init)
        return count_kernels(lambda: model.logits(model(step, kv, st)[:, -1]))


def per_layer(kind: str, backend: str, batch: int, fuse: bool = True) -> dict[str, object]:
    """Kernels of the fixed part, of one GDN layer and of one attention layer (differences of counts)."""
    from ninfer.model.config import FULL, LINEAR

    base = decode_step_counts(kind, (LINEAR, FULL), backend, batch, fuse)
    two_gdn = decode_step_counts(kind, (LINEAR, LINEAR, FULL), backend, batch, fuse)
    two_attn = decode_step_counts(kind, (LINEAR, FULL, FULL), backend, batch, fuse)
    gdn, attn = two_gdn - base, two_attn - base
    fixed = base - gdn - attn
    return {"fixed": fixed, "gdn_layer": gdn, "attention_layer": attn}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--by-op", action="store_true", help="print the per-layer counts by op")
    ap.add_argument("--unfused", action="store_true", help="separate projections (as CPU loads run)")
    args = ap.parse_args()
    if args.backend != "reference" and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from ninfer.kernels.triton.interpreter_fixes import patch_interpreter

        patch_interpreter()
    out: dict[str, object] = {}
    for model, (n_gdn, n_attn, kind) in FULL_DEPTH.items():
        parts = per_layer(kind, args.backend, args.batch, fuse=not args.unfused)
        sizes = {k: sum(v.values()) for k, v in parts.items()}
        total = sizes["fixed"] + n_gdn * sizes["gdn_layer"] + n_attn * sizes["attention_layer"]
        out[model] = {"per_part": sizes, "decode_step_kernels": total}
        if args.by_op:
            out[model]["by_op"] = {k: dict(sorted(v.items())) for k, v in parts.items()}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
