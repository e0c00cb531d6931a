"""Fast GPU kernels in Triton: GDN decode/verify step, slot-indexed causal conv, paged attention."""

from ninfer.kernels.triton.conv1d import causal_conv1d_update, causal_conv1d_with_state
from ninfer.kernels.triton.gdn_decode import gdn_decode_step, gdn_step_gated, recurrent_gated_delta_rule

__all__ = [
    "causal_conv1d_update",
    "causal_conv1d_with_state",
    "gdn_decode_step",
    "gdn_step_gated",
    "recurrent_gated_delta_rule",
]
