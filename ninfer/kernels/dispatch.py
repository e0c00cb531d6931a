"""One dispatch table: which implementation of each op runs for a (device type, backend) pair."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ninfer.kernels import attention_ref, conv_ref, gdn_ref, moe_ref


@dataclass(frozen=True)
class Ops:
    """The op set the model calls. Every backend provides all of them (falling back to the reference)."""

    name: str
    # (q, k, v, g, beta, initial_state, chunk=64) -> (o [B,T,nv,dv], final_state [B,nv,dk,dv] fp32)
    chunk_gated_delta_rule: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    # (q, k, v, g, beta, initial_state) -> (o, final_state)
    recurrent_gated_delta_rule: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    # (x [B,T,C], weight [C,K], conv_state [B,C,K-1]) -> (y [B,T,C], new_state [B,C,K-1])
    causal_conv1d_with_state: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    # (k_pool, v_pool, k [B,q,nkv,hd], v, page_table, cache_lens) -> None (in place)
    write_kv: Callable[..., None]
    # (q [B,q,nh,hd], k_pool, v_pool, page_table, cache_lens, scale, max_kv_len=None) -> o [B,q,nh,hd]
    paged_attention: Callable[..., torch.Tensor]
    # (x [N,H], gate_up [E,2Ie,H], down [E,H,Ie], topk_idx [N,k], topk_w [N,k]) -> [N,H]
    moe_experts: Callable[..., torch.Tensor]


def _reference() -> Ops:
    return Ops(
        name="reference",
        chunk_gated_delta_rule=gdn_ref.chunk_gated_delta_rule,
        recurrent_gated_delta_rule=gdn_ref.recurrent_gated_delta_rule,
        causal_conv1d_with_state=conv_ref.causal_conv1d_with_state,
        write_kv=attention_ref.write_kv,
        paged_attention=attention_ref.paged_attention,
        moe_experts=moe_ref.moe_experts,
    )


# backend name -> (device types it runs on, factory)
_REGISTRY: dict[str, tuple[frozenset[str], Callable[[], Ops]]] = {
    "reference": (frozenset({"cpu", "cuda"}), _reference),
}


def register_backend(name: str, device_types: set[str] | frozenset[str], factory: Callable[[], Ops]) -> None:
    """Add a backend (e.g. fast GPU kernels); its factory is called lazily by `get_ops`."""
    if name in _REGISTRY:
        raise ValueError(f"kernel backend {name!r} is already registered")
    _REGISTRY[name] = (frozenset(device_types), factory)


def backends() -> dict[str, tuple[str, ...]]:
    """Registered backend names and the device types each supports."""
    return {name: tuple(sorted(devs)) for name, (devs, _) in sorted(_REGISTRY.items())}


def get_ops(device_type: str, backend: str = "reference") -> Ops:
    """The op set for `device_type` ("cpu", "cuda") and `backend`; unknown pairs raise with the valid ones."""
    entry = _REGISTRY.get(backend)
    if entry is None:
        raise ValueError(f"unknown kernel backend {backend!r}; valid backends: {backends()}")
    devices, factory = entry
    if device_type not in devices:
        valid = sorted(n for n, (d, _) in _REGISTRY.items() if device_type in d)
        raise ValueError(
            f"kernel backend {backend!r} does not run on device type {device_type!r} "
            f"(it supports {sorted(devices)}); backends for {device_type!r}: {valid}"
        )
    return factory()
