"""The bench's fast-path check (ops/bench/fast_path.py) on a tiny bf16 model (CPU interpreter):
the triton op set passes within the reference's own noise; a wrong op set fails."""

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
from ninfer.kernels.triton.backend import triton_ops
from ops.bench.fast_path import check_fast_path

DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"


def test_fast_path_check_passes_triton_and_fails_a_wrong_op() -> None:
    model = our_model(hf_model("moe", seed=5)).to(DEVICE, torch.bfloat16)
    model.init_buffers(DEVICE)
    ids = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(3)).tolist()
    fast = triton_ops()
    good = check_fast_path(model, "triton", ids, DEVICE, fast_ops=fast)
    assert good["checked"] and good["ok"], good
    assert max(good["reference_noise"].values()) > 0  # bf16: chunking changes the roundings

    def wrong_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return norm_ref.rms_norm(x, weight, eps) * 1.05  # a 5 % gain error in every 1+w norm

    bad = check_fast_path(
        model, "triton", ids, DEVICE, fast_ops=dataclasses.replace(fast, rms_norm=wrong_norm)
    )
    assert not bad["ok"], bad
