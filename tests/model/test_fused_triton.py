"""The "triton" backend reads the fused projections' strided views in place (CPU interpreter).

Every op fed a view of a fused output: conv_step (qkv), gdn_step (a, b), gated_rms_norm (z),
norm_rope (query half, k), write_kv (v), silu_mul (gate | up halves), moe_route (router logits),
shared_expert_add (shared gate logit); a fused MLP's activation + down projection (swiglu_linear).
"""

import copy
import dataclasses
import os
from unittest import mock

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")

from fused_models import fused_copy, run_phases, tiny_model

from ninfer.kernels import moe_ref
from ninfer.kernels.dispatch import get_ops
from ninfer.model.config import FULL, LINEAR
from ninfer.model.ffn import GATE_UP, MLP
from ninfer.model.projections import linear, project

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


def _mlp_before(mlp: MLP, x: torch.Tensor) -> torch.Tensor:
    """The MLP forward before `Ops.swiglu_linear`: views of the fused gate | up, silu_mul, then `linear`."""
    gate, up = project(mlp, x, "gate_up_proj", GATE_UP)
    return linear(mlp.ops, mlp.ops.silu_mul(gate, up), mlp.down_proj.weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 20])  # decode, verify (GEMV), prefill (silu_mul + F.linear)
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_fused_mlp_swiglu_linear(backend: str, rows: int, dtype: torch.dtype) -> None:
    """A fused MLP goes through `Ops.swiglu_linear`: identical to the path before it (silu_mul on the
    views, then `linear`) and close to the unfused torch MLP."""
    from ninfer.kernels.triton import library as lib
    from ninfer.kernels.triton.backend import triton_ops

    base = triton_ops() if backend == "triton" else get_ops("cpu", "reference")
    op = mock.Mock(wraps=base.swiglu_linear)
    ops = dataclasses.replace(base, swiglu_linear=op)
    gen = torch.Generator().manual_seed(rows)
    unfused = MLP(96, 80).to(dtype)  # ops None: torch silu * up
    with torch.no_grad():
        for p in unfused.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    fused = copy.deepcopy(unfused)
    fused.ops = ops
    fused.fuse_projections()
    x = (torch.randn(2, rows, 96, generator=gen) * 2).to(dtype)
    with torch.no_grad(), mock.patch.object(lib, "swiglu_linear_op", wraps=lib.swiglu_linear_op) as gemv_act:
        y = fused(x)
        assert op.call_count == 1
        assert gemv_act.call_count == (backend == "triton" and 2 * rows <= 16)  # the one-launch GEMV
        assert torch.equal(y, _mlp_before(fused, x))
        ref = unfused(x)
    err = ((y - ref).abs().max() / ref.abs().max()).item()
    assert y.shape == (2, rows, 96) and err <= (1e-4 if dtype == torch.float32 else 1e-2), err
