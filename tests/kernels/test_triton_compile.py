"""torch.compile traces a whole decode step with the "triton" backend's custom ops (CPU interpreter).

fullgraph=True: no graph break anywhere in the step; the Triton ops stay opaque `ninfer::` nodes
(Inductor never re-compiles their kernels); aot_eager (functionalised, mutated pools written back)
gives the eager logits and pool states.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of the kernels

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'triton==3.6.*'")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from ref_models import VOCAB, hf_model, our_model

from ninfer.kernels import get_ops
from ninfer.kernels.triton.backend import triton_ops
from ninfer.model.cache import KVPool, StatePool, make_batch

DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"
pytestmark = pytest.mark.usefixtures("interpreted_whole_model")  # see tests/kernels/conftest.py


def _prefilled(kind: str):
    model = our_model(hf_model(kind, seed=5)).to(DEVICE)
    model.init_buffers(DEVICE)
    model.set_ops(get_ops(DEVICE, "reference"))  # the prefill only fills the pools; the step is tested
    cfg = model.config
    kv = KVPool.for_config(cfg, 4, torch.float32, DEVICE)
    states = StatePool.for_config(cfg, 2, torch.float32, DEVICE)
    ids = torch.randint(0, VOCAB, (2, 21), generator=torch.Generator().manual_seed(6)).tolist()
    pages = [[3, 1], [0, 2]]
    with torch.no_grad():
        for b in range(2):
            model(make_batch([ids[b][:20]], [0], [b], [pages[b]], device=DEVICE), kv, states)
    model.set_ops(triton_ops())
    step = make_batch([[r[20]] for r in ids], [20, 20], [0, 1], pages, device=DEVICE)
    step.max_kv_len = None  # the static-width form the CUDA graphs use
    return model, kv, states, step


def _pools(kv: KVPool, st: StatePool) -> list[torch.Tensor]:
    return [*kv.k, *kv.v, *st.conv, *st.ssm]


def test_decode_step_compiles_in_one_graph() -> None:
    """The MoE model: every op of the dense one (its shared expert is the dense MLP) and the MoE ops."""
    model, kv, st, step = _prefilled("moe")
    saved = [p.clone() for p in _pools(kv, st)]

    def decode() -> torch.Tensor:
        return model.logits(model(step, kv, st)[:, -1])

    with torch.no_grad():
        eager = decode()
    after_eager = [p.clone() for p in _pools(kv, st)]
    for p, s in zip(_pools(kv, st), saved, strict=True):
        p.copy_(s)

    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        graphs.append(gm)
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(decode, backend=record, fullgraph=True)()
    assert len(graphs) == 1
    targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    custom = {t for t in targets if t.startswith("ninfer.")}
    expected = {"ninfer.gdn_step.default", "ninfer.conv_step.default", "ninfer.paged_attention.default",
                "ninfer.write_kv.default", "ninfer.norm_rope.default", "ninfer.add_rms_norm.default",
                "ninfer.gated_rms_norm.default", "ninfer.rms_norm.default", "ninfer.sigmoid_gate.default",
                "ninfer.silu_mul.default", "ninfer.shared_expert_add.default", "ninfer.moe_route.default",
                "ninfer.moe_experts_small.default"}  # fmt: skip
    assert expected <= custom, sorted(targets)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(_pools(kv, st), after_eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
