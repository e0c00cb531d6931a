"""The decoder-layer steps a forward calls, eager or `torch.compile`d once per layer kind.

Regional compilation: one trace of a whole decode step is 40-64 copies of the same layer code
(too slow to compile on a full-size model), so each layer kind's step is compiled on its own,
the layer an argument: `DecoderLayer.forward_attention` (gated attention + FFN and the norm
between them) and `DecoderLayer.forward_linear` (the GDN mixer + FFN). Dynamo lifts the layer's
parameters, the KV pages and the GDN slot pools as graph inputs and guards on their shapes and
on the layer's config-wide attributes (head counts, eps, fused projection groups), never on the
layer object, so ONE compiled graph serves every layer of its kind. Nothing per-layer that is a
Python int reaches the traced code: the pool index picks the layer's pools before the call (a
`KVLayer` holds tensors only). Layers whose weights differ in quantized format compile once per
format. Batch size and tokens per row are automatic-dynamic (`dynamic=None`): the first size of a
dimension compiles static, the second makes it symbolic; size 1 specializes. The layer's input
norm (`DecoderLayer.input_norm`: the previous layer's deferred FFN output added and normed, one
op) stays between the steps, outside them: the first layer's has no residual to add (one more
compiled variant inside), and the graph segments' cuts and a drafter's captured layer outputs are
taken there. The MTP head's layer runs the attention step too.

Which calls take the compiled steps (`steps_for`): those whose GDN layers run the per-token step
ops in place on the slot pools (at most `STEP_MAX_TOKENS` tokens a row, or per-token state
writes): decode, speculative verification and the captured prefill rows, the steps a CUDA graph
replays. Longer prefill chunks stay eager: their time is the chunked GDN rule (fla, whose kernels
are not opaque custom ops), attention and GEMMs over many tokens, the glue a compile would fuse
is a small share of it, and every new length class would cost another compile.

The Triton kernels are `torch.library` custom ops, opaque to Inductor; the elementwise and
reduction glue between them fuses. The CPU reference step ops write only the rows whose slots
are valid (a data-dependent `nonzero`); `capture_dynamic_output_shape_ops` traces that instead of
breaking the graph there. Dynamo's and Inductor's settings are thread-local (their overrides live
in `ContextVar`s, which a new thread does not inherit), so each compiled step applies its own in
the thread that calls it, the engine thread included, before its first call there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ninfer.model.cache import ForwardBatch, KVLayer
from ninfer.model.gdn import GDNSlots, takes_step
from ninfer.model.layers import DecoderLayer

# (layer, x, y, cos, sin, kv, batch) -> (h, f); x, y [B, q, H], cos / sin [B, q, rot]
AttentionStep = Callable[
    [DecoderLayer, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, KVLayer, ForwardBatch],
    tuple[torch.Tensor, torch.Tensor],
]
# (layer, x, y, conv_pool, ssm_pool, slots) -> (h, f); x, y [B, q, H]
LinearStep = Callable[
    [DecoderLayer, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, GDNSlots],
    tuple[torch.Tensor, torch.Tensor],
]


@dataclass(frozen=True)
class LayerSteps:
    """The step of each decoder-layer kind, the layer its first argument."""

    attention: AttentionStep
    linear: LinearStep


EAGER = LayerSteps(DecoderLayer.forward_attention, DecoderLayer.forward_linear)


_threads = threading.local()  # `limit`: the recompile limit this thread's settings were raised to


def _configure_thread(recompile_limit: int) -> None:
    """Dynamo and Inductor settings for the compiled steps, in the calling thread: Inductor compiles
    in this process (its worker subprocesses failed on the H200 machine, b4b914b); the recompile
    limit is raised to `recompile_limit`, never lowered; masked slot writes trace."""
    import torch._dynamo
    import torch._inductor.config

    torch._inductor.config.compile_threads = 1
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, recompile_limit)
    config.capture_dynamic_output_shape_ops = True  # the reference step ops' masked slot writes
    _threads.limit = max(recompile_limit, getattr(_threads, "limit", 0))


@dataclass(frozen=True)
class _InThread:
    """A compiled step that applies its settings in the calling thread before its first call there."""

    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    recompile_limit: int

    def __call__(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if getattr(_threads, "limit", 0) < self.recompile_limit:
            _configure_thread(self.recompile_limit)
        return self.fn(*args)


def compiled_steps(
    dynamic: bool | None = None, backend: str = "inductor", recompile_limit: int = 64
) -> LayerSteps:
    """One `torch.compile` per layer kind (graph breaks allowed, counted by Dynamo), compiled at
    its first call of each shape class. `recompile_limit`: the compiled variants each kind may
    keep (its decode, verify and prefill shapes)."""
    _configure_thread(recompile_limit)  # this thread's too (a caller may read them back)

    def compiled(step: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> _InThread:
        return _InThread(torch.compile(step, dynamic=dynamic, backend=backend), recompile_limit)

    return LayerSteps(compiled(DecoderLayer.forward_attention), compiled(DecoderLayer.forward_linear))


def steps_for(steps: LayerSteps | None, batch: ForwardBatch) -> LayerSteps:
    """The installed `steps` for a step-sized call (see the module docstring), else the eager ones."""
    if steps is None or not takes_step(batch.input_ids.shape[1], batch.write_slots is not None):
        return EAGER
    return steps
