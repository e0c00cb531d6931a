"""Kernel ops: torch references (CPU and GPU) and fast GPU ops, chosen by `dispatch.get_ops`."""

from ninfer.kernels.dispatch import Ops, backends, get_ops, register_backend

__all__ = ["Ops", "backends", "get_ops", "register_backend"]
