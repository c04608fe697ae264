"""Functional sequence-mixing ops (docs/design.md §3).

Layout: q, k: [B, T, H, K]; v: [B, T, H, V]; gates g in log space ([B, T, H] or
[B, T, H, K]); beta: [B, T, H] in (0, 1]. Every op returns (o, final_state) and takes
backend="auto" | "reference" | "torch" | "triton" (softmax: "torch", i.e. SDPA, or the
FlashAttention backends "fa4", "fa3", "flash_attn").
Each op has a one-token `<op>_step` for decoding.

Each op lives in the folder of its name, with its OpSpec in spec.py (kernels.common.spec) and
its line in kernels.registry; importing the function here rebinds the package attribute from
the sub-package to the function, so `kernels.delta_rule` is the op.
Triton is imported only when a triton backend runs.
"""

from kernels.common.dispatch import BackendStatus, backend_status, resolve_backend
from kernels.delta_rule import delta_rule, delta_rule_step
from kernels.gated_delta_rule import gated_delta_rule, gated_delta_rule_step
from kernels.gated_linear_attention import gated_linear_attention, gated_linear_attention_step
from kernels.linear_attention import linear_attention, linear_attention_step
from kernels.linearized_softmax_gdn import (
    LinGDNState,
    linearized_softmax_gdn,
    linearized_softmax_gdn_step,
    vala_attention,
)
from kernels.mesa import MesaState, mesa, mesa_step
from kernels.registry import SPECS, op_names, op_spec
from kernels.softmax_attention import KVCache, softmax_attention, softmax_attention_step

OPS = op_names("op")

__all__ = [
    "OPS",
    "SPECS",
    "BackendStatus",
    "KVCache",
    "LinGDNState",
    "MesaState",
    "backend_status",
    "delta_rule",
    "delta_rule_step",
    "gated_delta_rule",
    "gated_delta_rule_step",
    "gated_linear_attention",
    "gated_linear_attention_step",
    "linear_attention",
    "linear_attention_step",
    "linearized_softmax_gdn",
    "linearized_softmax_gdn_step",
    "mesa",
    "mesa_step",
    "op_spec",
    "resolve_backend",
    "softmax_attention",
    "softmax_attention_step",
    "vala_attention",
]
