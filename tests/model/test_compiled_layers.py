"""Regional compilation (`Qwen35Model.compile_layers`): the compiled layer steps decode the eager
greedy tokens, and Dynamo compiles as many graphs for 8 decoder layers as for 4 (one step per layer
kind, the layer an input), with no graph break on the decode path.

Dynamo is imported inside the tests: importing it imports triton, which the interpreter tests
(tests/model/test_fused_triton.py, tests/kernels) need imported after they set TRITON_INTERPRET."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from fused_models import VOCAB, tiny_model

from ninfer.model.cache import ForwardBatch, KVPool, StatePool, make_batch
from ninfer.model.config import FULL, LINEAR
from ninfer.model.qwen35 import Qwen35Model

# prompts of sequences 0..3 (sequence i: slot i, page i), each more than 16 tokens: an eager
# (chunked) prefill, so only the decode rounds compile
PROMPTS = [[(7 * i + 3 * j) % VOCAB for j in range(n)] for i, n in enumerate((20, 17, 19, 18))]
ROUNDS = (((3,), 1), ((0, 1, 2), 3))  # (rows, decode rounds): one at batch 1, then three at batch 3
KIND = (LINEAR, LINEAR, LINEAR, FULL)  # four layers, both kinds

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _counters() -> Any:
    """Dynamo's counters (imported here: see the module docstring)."""
    from torch._dynamo.utils import counters

    return counters


def _decode_batch(rows: Sequence[int], tokens: list[list[int]]) -> ForwardBatch:
    """One decode round of `rows`: each row's last token after its prompt and earlier tokens."""
    starts = [len(PROMPTS[i]) + len(tokens[i]) - 1 for i in rows]
    return make_batch([[tokens[i][-1]] for i in rows], starts, list(rows), [[i] for i in rows])


def greedy_tokens(model: Qwen35Model) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prefill every prompt alone, then the greedy decode ROUNDS, then the MTP head over the last
    round's rows. -> (each sequence's tokens, the float32 logits [B, V] of every round and the MTP's)."""
    cfg = model.config
    kv = KVPool.for_config(cfg, len(PROMPTS), torch.float32, "cpu")
    st = StatePool.for_config(cfg, len(PROMPTS), torch.float32, "cpu")
    mtp_kv = KVPool.for_config(cfg, len(PROMPTS), torch.float32, "cpu", num_layers=1)
    tokens: list[list[int]] = []
    rounds: list[torch.Tensor] = []
    with torch.inference_mode():
        for i, prompt in enumerate(PROMPTS):
            hidden = model(make_batch([prompt], [0], [i], [[i]]), kv, st)  # [1, n, H]
            tokens.append([int(model.logits(hidden[:, -1]).argmax())])
        for rows, steps in ROUNDS:
            for _ in range(steps):
                hidden = model(_decode_batch(rows, tokens), kv, st)  # [B, 1, H]
                rounds.append(model.logits(hidden[:, -1]))  # [B, V]
                for i, t in zip(rows, rounds[-1].argmax(-1).tolist(), strict=True):
                    tokens[i].append(t)
        assert model.mtp is not None  # its layer over the last round's rows, its own pages
        rows = ROUNDS[-1][0]
        nxt = make_batch([[tokens[i][-1]] for i in rows], [5] * len(rows), list(rows), [[i] for i in rows])
        rounds.append(model.mtp.logits(model.mtp(nxt, hidden, mtp_kv)[:, -1]))
    return tokens, rounds


def test_compiled_layer_steps_decode_the_eager_greedy_tokens() -> None:
    """Inductor: decode rounds at batch 1 and 3, then the MTP head through the compiled attention
    step, give the greedy tokens and logits of the eager layers (four graphs: each kind at batch
    1, then with the batch and the attention's key bound symbolic)."""
    import torch._inductor.config

    model = tiny_model("dense", layers=KIND)
    want, want_logits = greedy_tokens(model)
    model.compile_layers()
    assert model.mtp is not None and model.mtp.layer_steps is model.layer_steps
    # scalar C++ (no vector ISA probe, no vectorized kernels): the same fusions at half the compile time
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        got, got_logits = greedy_tokens(model)
    assert got == want
    for a, b in zip(want_logits, got_logits, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    counters = _counters()
    assert counters["stats"]["unique_graphs"] == 4 and not counters["graph_break"]
    model.eager_layers()
    assert model.layer_steps is None and model.mtp.layer_steps is None


def _decode_compiles(layers: int, sizes: Sequence[int]) -> tuple[int, int, int]:
    """A `layers`-deep model's decode rounds at each batch size of `sizes`, one round each (every
    row after 5 tokens), through the compiled steps on Dynamo alone (its `eager` backend: what is
    counted is Dynamo's frames and graphs). -> (frames, graphs, graph breaks) compiled."""
    import torch._dynamo

    counters = _counters()
    torch._dynamo.reset()
    counters.clear()
    model = tiny_model("dense", layers=KIND * (layers // len(KIND)))
    model.compile_layers(backend="eager")
    kv = KVPool.for_config(model.config, max(sizes), torch.float32, "cpu")
    st = StatePool.for_config(model.config, max(sizes), torch.float32, "cpu")
    with torch.inference_mode():
        for b in sizes:
            model(make_batch([[1]] * b, [5] * b, list(range(b)), [[i] for i in range(b)]), kv, st)
    return counters["frames"]["ok"], counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


@pytest.mark.parametrize(("sizes", "graphs"), [((1,), 2), ((1, 2, 3, 4), 4)])
def test_compiled_graphs_do_not_grow_with_the_layers(sizes: tuple[int, ...], graphs: int) -> None:
    """One graph per layer kind at batch 1; the second batch size makes the batch dimension
    symbolic (one more per kind), which serves 3 and 4; 8 layers compile what 4 do (no guard on
    the layer or its index), and the decode path has no graph break."""
    four, eight = _decode_compiles(4, sizes), _decode_compiles(8, sizes)
    assert four == eight == (graphs, graphs, 0)
