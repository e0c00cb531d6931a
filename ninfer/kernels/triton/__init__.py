"""Fast GPU kernels in Triton: GDN decode/verify step, slot-indexed causal conv, paged attention."""

from ninfer.kernels.triton.conv_step import conv_step
from ninfer.kernels.triton.gdn_decode import gdn_decode_step, gdn_step_gated, recurrent_gated_delta_rule
from ninfer.kernels.triton.kv_int8 import quantize_kv_int8, write_kv_int8
from ninfer.kernels.triton.paged_attention import paged_attention, paged_attention_decode

__all__ = [
    "conv_step",
    "gdn_decode_step",
    "gdn_step_gated",
    "paged_attention",
    "paged_attention_decode",
    "quantize_kv_int8",
    "recurrent_gated_delta_rule",
    "write_kv_int8",
]
