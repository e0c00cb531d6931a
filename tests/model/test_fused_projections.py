"""Fused projections give the unfused model's outputs and names; the deferred residual is bit-identical."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from fused_models import PAGES, VOCAB, fused_copy, run_phases, tiny_config, tiny_model
from torch import nn

from ninfer.model.cache import ForwardBatch, KVPool, StatePool, make_batch
from ninfer.model.config import FULL
from ninfer.model.gdn import GDNSlots
from ninfer.model.qwen35 import Qwen35Model
from ninfer.model.weights import fuse_default, load_model
from tests.fp32_reorder import longest_reduction, reorder_tolerance

KINDS = ["dense", "moe"]
# the fused parameters and the projections each one replaces, per module kind
GROUPS = {
    "linear_attn.in_proj_qkvzba": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
    "self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "mlp.gate_up_proj": ("gate_proj", "up_proj"),
    "mlp.router": ("gate", "shared_expert_gate"),
    "mlp.shared_expert.gate_up_proj": ("gate_proj", "up_proj"),
}


@pytest.fixture(scope="module", params=KINDS)
def pair(request: pytest.FixtureRequest) -> tuple[Qwen35Model, Qwen35Model]:
    model = tiny_model(request.param)
    return model, fused_copy(model)


def test_fused_outputs_equal_unfused(pair: tuple[Qwen35Model, Qwen35Model]) -> None:
    """fp32: prefill (chunked), decode, verify (per-token slots), MTP: logits and every pool equal up
    to the GEMMs' reduction order (bounded by the model's longest reduction, not by a constant
    tuned to one machine's thread count)."""
    unfused, fused = pair
    k = longest_reduction(unfused)
    a, b = run_phases(unfused), run_phases(fused)
    for x, y in zip(a.all_logits(), b.all_logits(), strict=True):
        assert x.abs().max() > 1.0  # not a degenerate all-zero run
        torch.testing.assert_close(y, x, **reorder_tolerance(x, k))
    for x, y in zip(a.pools, b.pools, strict=True):
        torch.testing.assert_close(y, x, **reorder_tolerance(x, k))


def test_fused_parameters_and_canonical_state_dict(pair: tuple[Qwen35Model, Qwen35Model]) -> None:
    unfused, fused = pair
    names = {n for n, _ in fused.named_parameters()}
    layer_groups = [g for g in GROUPS if f"layers.0.{g}" in names or f"layers.1.{g}" in names]
    want = {"linear_attn.in_proj_qkvzba", "self_attn.qkv_proj", "mlp.gate_up_proj"}
    if unfused.config.is_moe:
        want = want - {"mlp.gate_up_proj"} | {"mlp.router", "mlp.shared_expert.gate_up_proj"}
    assert set(layer_groups) == want
    assert "mtp.layers.0.self_attn.qkv_proj" in names
    assert fused.mtp is not None
    for layer in [*fused.layers, *fused.mtp.layers]:
        mixer = layer.self_attn if layer.kind == FULL else layer.linear_attn
        gone = GROUPS["self_attn.qkv_proj" if layer.kind == FULL else "linear_attn.in_proj_qkvzba"]
        ffns = [layer.mlp.shared_expert, layer.mlp] if unfused.config.is_moe else [layer.mlp]
        assert not any(hasattr(mixer, p) for p in gone)
        assert not any(
            hasattr(m, p) for m in ffns for p in ("gate_proj", "up_proj", "gate", "shared_expert_gate")
        )
    # state_dict: the canonical names (artifact / checkpoint), same values, the fused weight's rows
    sd_u, sd_f = unfused.state_dict(), fused.state_dict()
    assert sorted(sd_f) == sorted(sd_u)
    for k, v in sd_u.items():
        assert torch.equal(sd_f[k], v), k
    assert sd_f["layers.0.linear_attn.in_proj_z.weight"].is_contiguous()
    # unfused names load into a fused model (strict), and back
    other = fused_copy(tiny_model("moe" if unfused.config.is_moe else "dense"))
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    other.load_state_dict(sd_u, strict=True)
    assert all(torch.equal(other.state_dict()[k], v) for k, v in sd_u.items())


def test_fusion_frees_the_originals() -> None:
    model = tiny_model("moe")
    watched = [
        weakref.ref(model.layers[0].linear_attn.in_proj_a.weight),
        weakref.ref(model.layers[1].self_attn.v_proj.weight),
        weakref.ref(model.layers[1].mlp.shared_expert_gate.weight),
        weakref.ref(model.layers[1].mlp.shared_expert.up_proj.weight),
        weakref.ref(model.mtp.layers[0].self_attn.q_proj.weight),  # type: ignore[union-attr]
    ]
    before = sum(p.numel() for p in model.parameters())
    model.fuse_projections()
    model.fuse_projections()  # a second call changes nothing
    gc.collect()
    assert all(w() is None for w in watched)
    assert sum(p.numel() for p in model.parameters()) == before


@pytest.mark.parametrize("kind", KINDS)
def test_load_model_fuses_on_cuda_only(kind: str) -> None:
    model = tiny_model(kind)
    canonical = {
        (k if k.startswith(("lm_head.", "mtp.")) else "model." + k): v for k, v in model.state_dict().items()
    }
    assert fuse_default("cuda") and fuse_default(torch.device("cuda", 0)) and not fuse_default("cpu")
    plain = load_model(tiny_config(kind), canonical)
    assert hasattr(plain.layers[0].linear_attn, "in_proj_qkv")
    assert plain.mtp is not None and hasattr(plain.mtp.layers[0].self_attn, "q_proj")
    fused = load_model(tiny_config(kind), canonical, fuse=True)
    assert not hasattr(fused.layers[0].linear_attn, "in_proj_qkv")
    assert fused.mtp is not None and hasattr(fused.mtp.layers[0].self_attn, "qkv_proj")
    a, b = run_phases(plain, seed=3), run_phases(fused, seed=3)
    for x, y in zip(a.all_logits(), b.all_logits(), strict=True):
        torch.testing.assert_close(y, x, **reorder_tolerance(x, longest_reduction(plain)))


@pytest.mark.parametrize("consume", [False, True])
def test_load_model_consume_frees_the_loaded_parts(consume: bool) -> None:
    """A server load hands its tensor dict over (`consume`): fusing then frees each part as its fused
    weight is built, so the load peaks at the weights plus one group, not at twice the fused ones."""
    model = tiny_model("dense")
    canonical = {
        (k if k.startswith(("lm_head.", "mtp.")) else "model." + k): v.clone() for k, v in model.state_dict().items()
    }
    watched = [weakref.ref(canonical[k]) for k in ("model.layers.0.linear_attn.in_proj_z.weight", "model.layers.1.mlp.up_proj.weight")]
    fused = load_model(tiny_config("dense"), canonical, fuse=True, consume=consume)
    gc.collect()
    assert not hasattr(fused.layers[1].mlp, "up_proj")
    assert (canonical == {}) is consume
    assert all((w() is None) is consume for w in watched)


def _old_forward(model: Qwen35Model, batch: ForwardBatch, kv: KVPool, states: StatePool):
    """The layer loop before the deferred residual: `x = h + mlp(norm(h))` at the end of every layer."""
    assert model.rotary is not None
    x = model.embed_tokens(batch.input_ids)
    cos, sin = model.rotary(batch.positions, x.dtype)
    slots = GDNSlots(batch.slots, batch.gdn_write_slots(), batch.write_slots is not None)
    outs = []
    for layer, j in zip(model.layers, model.pool_index, strict=True):
        if layer.kind == FULL:
            mixed = layer.self_attn(layer.input_layernorm(x), cos, sin, kv.layer(j), batch)
        else:
            mixed = layer.linear_attn(layer.input_layernorm(x), states.conv[j], states.ssm[j], slots)
        h, y = layer.post_attention_layernorm.add(x, mixed)
        x = h + layer.mlp(y)
        outs.append(x)
    return model.norm(x), outs


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fuse", [False, True])
def test_deferred_residual_is_bit_identical(kind: str, fuse: bool) -> None:
    """bf16: the next norm's add rounds h + f exactly as the separate add did; captured layer outputs
    (a DFlash drafter's features) too. Prefill, decode and verify calls."""
    model = tiny_model(kind, torch.bfloat16)
    if fuse:
        model = fused_copy(model)
    model.capture_layers = tuple(range(len(model.layers)))
    ids = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(4)).tolist()
    calls = [
        make_batch([ids[0][:24]], [0], [0], [PAGES[0]]),
        make_batch([ids[0][24:25], ids[1][:1]], [24, 0], [0, 1], PAGES),
        make_batch(
            [ids[0][25:29], ids[1][1:5]], [25, 1], [0, 1], PAGES, write_slots=[[2, 3, -1, 4], [5] * 4]
        ),
    ]
    pools = [(KVPool.for_config(model.config, 5, torch.bfloat16, "cpu"),
              StatePool.for_config(model.config, 6, torch.bfloat16, "cpu")) for _ in range(2)]  # fmt: skip
    with torch.no_grad():
        for batch in calls:
            new = model(batch, *pools[0])
            old, outs = _old_forward(model, batch, *pools[1])
            assert torch.equal(new, old)
            assert sorted(model.captured) == list(range(len(outs)))
            assert all(torch.equal(model.captured[i], o) for i, o in enumerate(outs))
    for x, y in zip(pools[0][1].ssm + pools[0][0].k, pools[1][1].ssm + pools[1][0].k, strict=True):
        assert torch.equal(x, y)


def test_fuse_rejects_a_biased_projection() -> None:
    model = tiny_model("dense")
    attn = model.layers[1].self_attn
    attn.k_proj = nn.Linear(attn.k_proj.in_features, attn.k_proj.out_features, bias=True)
    with pytest.raises(TypeError, match="bias-free"):
        attn.fuse_projections()
