"""The bench's fast-path check (ops/bench/fast_path.py) on a tiny bf16 model (CPU interpreter):
the triton op set passes within the reference's own noise; a wrong op set fails.

A 24-token prompt on this model meets one exact router tie; the triton router keeps the lower
expert id, torch.topk on the CPU the other, and that one flip alone moved the last logits by
3.8e-2 against a reference noise of 6.8e-3 (measured while writing this test), hence the
same-router rule."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # ops.bench
from ref_models import VOCAB, hf_model, our_model

from ninfer.kernels import norm_ref
from ninfer.kernels.dispatch import get_ops
from ninfer.kernels.triton.backend import triton_ops
from ops.bench.fast_path import check_fast_path

DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"


pytestmark = pytest.mark.usefixtures("interpreted_whole_model")  # see tests/kernels/conftest.py


def _model(kind: str):
    model = our_model(hf_model(kind, seed=5)).to(DEVICE, torch.bfloat16)
    model.init_buffers(DEVICE)
    return model


# 72 tokens: one-chunk prefill calls have more than moe.SMALL_MAX_TOKENS tokens, so the fast path's
# prefill MoE is the loop (no grouped GEMM on the CPU) and mostly its decode step runs the (slow to
# interpret) small-MoE kernels
IDS = torch.randint(0, VOCAB, (72,), generator=torch.Generator().manual_seed(3)).tolist()


def test_fast_path_check_passes_the_triton_ops() -> None:
    """On the CPU the triton op set runs with the reference router: the check then judges its one
    fast run pair, not two (the interpreter pays minutes per pair); the triton router is still
    checked against the reference on random logits. Compiled on a GPU, the whole triton set runs."""
    ops = triton_ops()
    if DEVICE == "cpu":
        ops = dataclasses.replace(ops, moe_route=get_ops("cpu", "reference").moe_route)
    good = check_fast_path(_model("moe"), "triton", IDS, DEVICE, fast_ops=ops, router_rows=64)
    assert good["checked"] and good["ok"], good
    assert good["router"]["ok"] and good["router"]["non_tie_mismatch"] == 0
    assert max(good["reference_noise"].values()) > 0  # bf16: chunking changes the roundings


def test_fast_path_check_fails_a_wrong_op() -> None:
    def wrong_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return norm_ref.rms_norm(x, weight, eps) * 1.05  # a 5 % gain error in every 1+w norm

    # the reference set with one wrong op: what is judged is the check, not the kernels (the
    # passing test above runs them), so nothing here needs the slow interpreter
    bad_ops = dataclasses.replace(get_ops("cpu", "reference"), rms_norm=wrong_norm)
    bad = check_fast_path(_model("dense"), "wrong-norm", IDS, DEVICE, fast_ops=bad_ops)
    assert bad["checked"] and not bad["ok"], bad
