"""One dispatch table: which implementation of each op runs for a (device type, backend) pair."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ninfer.kernels import attention_ref, conv_ref, gdn_ref, moe_ref
from ninfer.kernels.ops import Ops

log = logging.getLogger(__name__)


def _reference() -> Ops:
    return Ops(
        name="reference",
        chunk_gated_delta_rule=gdn_ref.chunk_gated_delta_rule,
        recurrent_gated_delta_rule=gdn_ref.recurrent_gated_delta_rule,
        causal_conv1d_with_state=conv_ref.causal_conv1d_with_state,
        gdn_step=gdn_ref.gdn_step,
        conv_step=conv_ref.conv_step,
        write_kv=attention_ref.write_kv,
        paged_attention=attention_ref.paged_attention,
        moe_experts=moe_ref.moe_experts,
    )


def _triton() -> Ops:
    from ninfer.kernels.triton.backend import triton_ops  # imports triton (and fla when installed)

    return triton_ops()


class BackendUnavailable(RuntimeError):
    """A named kernel backend cannot run here; the message says what is missing."""


def _optional(name: str, package: str, extra: str) -> Callable[[], Ops]:
    """Backends kept as install extras: no op of this build is implemented on them yet."""

    def factory() -> Ops:
        try:
            __import__(package)
        except ImportError as err:
            raise BackendUnavailable(
                f"kernel backend {name!r} needs the {package} package (pip install 'ninfer[{extra}]'): {err}"
            ) from None
        raise BackendUnavailable(
            f"kernel backend {name!r}: {package} is installed, but this build implements no op on it "
            "(paged GQA attention over 64-token pages, slot-indexed Gated DeltaNet steps); "
            "use 'triton' on CUDA or 'reference'"
        )

    return factory


# backend name -> (device types it runs on, factory)
_REGISTRY: dict[str, tuple[frozenset[str], Callable[[], Ops]]] = {
    "reference": (frozenset({"cpu", "cuda"}), _reference),
    "triton": (frozenset({"cuda"}), _triton),
    "xformers": (frozenset({"cuda"}), _optional("xformers", "xformers", "xformers")),
    "tensorrt": (frozenset({"cuda"}), _optional("tensorrt", "torch_tensorrt", "tensorrt")),
}
# fastest first: what `get_ops(device_type)` tries when no backend is named
_PREFERENCE: tuple[str, ...] = ("triton", "reference")


def register_backend(name: str, device_types: set[str] | frozenset[str], factory: Callable[[], Ops]) -> None:
    """Add a backend (e.g. fast GPU kernels); its factory is called lazily by `get_ops`."""
    if name in _REGISTRY:
        raise ValueError(f"kernel backend {name!r} is already registered")
    _REGISTRY[name] = (frozenset(device_types), factory)


def backends() -> dict[str, tuple[str, ...]]:
    """Registered backend names and the device types each supports."""
    return {name: tuple(sorted(devs)) for name, (devs, _) in sorted(_REGISTRY.items())}


def get_ops(device_type: str, backend: str | None = None) -> Ops:
    """The op set for `device_type` ("cpu", "cuda") and `backend`; unknown pairs raise with the valid ones.

    backend None picks the fastest backend that runs on `device_type` and imports: "triton" on
    CUDA (Triton kernels, fla for prefill), else "reference"; a backend that fails to import is
    logged and skipped.
    """
    if backend is None:
        return _fastest(device_type)
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


def _fastest(device_type: str) -> Ops:
    for name in _PREFERENCE:
        devices, factory = _REGISTRY[name]
        if device_type not in devices:
            continue
        if name == "reference":
            return factory()
        try:
            return factory()
        except ImportError as err:
            log.warning(
                "kernel backend %r is unavailable on %s (%s); trying the next", name, device_type, err
            )
    return get_ops(device_type, "reference")
