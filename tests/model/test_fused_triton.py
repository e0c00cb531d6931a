"""The "triton" backend reads the fused projections' strided views in place (CPU interpreter).

Every op fed a view of a fused output: conv_step (qkv), gdn_step (a, b), gated_rms_norm (z),
norm_rope (query half, k), write_kv (v), silu_mul (gate | up halves), moe_route (router logits),
shared_expert_add (shared gate logit).
"""

import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

from fused_models import fused_copy, run_phases, tiny_model

from ninfer.kernels import moe_ref
from ninfer.kernels.dispatch import get_ops
from ninfer.model.config import FULL, LINEAR

if os.environ["TRITON_INTERPRET"] == "0":
    pytest.skip("the tiny models run on the CPU: this check needs the interpreter", allow_module_level=True)
from ninfer.kernels.triton.interpreter_fixes import patch_interpreter

patch_interpreter()


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_fused_model_on_triton_ops_matches_unfused_reference(kind: str) -> None:
    from ninfer.kernels.triton.backend import triton_ops

    unfused = tiny_model(kind, layers=(LINEAR, FULL))  # one layer of each kind (and the MTP layer)
    fused = fused_copy(unfused)
    # the routed experts read no fused view (x is the layer's contiguous input): their kernels have
    # their own tests, and the reference keeps this check fast on the interpreter
    fused.set_ops(dataclasses.replace(triton_ops(), moe_experts=moe_ref.moe_experts))
    ref, out = run_phases(unfused, seed=7), run_phases(fused, seed=7)
    assert unfused.ops.name == get_ops("cpu", "reference").name
    for a, b in zip(ref.all_logits(), out.all_logits(), strict=True):
        err = ((b - a).abs().max() / a.abs().max()).item()
        assert err <= 1e-4, err
    for a, b in zip(ref.pools, out.pools, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
