"""The OpSpec of the gated delta rule (Gated DeltaNet; kernels.common.spec)."""

from __future__ import annotations

from typing import Any

from kernels.common import counts, inputs
from kernels.common.checks import matrix_state_checks
from kernels.common.spec import Counts, FlaKernel, OpSpec, chunked_backends
from kernels.gated_delta_rule.chunked import chunk_gated_delta_rule
from kernels.gated_delta_rule.reference import gated_delta_rule_reference


def decode_flops(B: int, H: int, K: int, V: int, context: int) -> float:
    # decay h (KV) + the delta-rule step (6KV).
    return float(B * H * 7 * K * V)


def gates(draw: inputs.Draw, B: int, T: int, H: int, K: int, V: int, variant: str) -> dict[str, Any]:
    return {"g": inputs.log_gate(draw, B, T, H, K, "scalar"), "beta": inputs.write_strength(draw, B, T, H)}


SPEC = OpSpec(
    name="gated_delta_rule",
    function="kernels.gated_delta_rule:gated_delta_rule",
    step="kernels.gated_delta_rule:gated_delta_rule_step",
    state="h: [B, H, K, V] tensor (fp32; fp64 for fp64 inputs)",
    backends=chunked_backends(
        gated_delta_rule_reference, chunk_gated_delta_rule,
        "kernels.gated_delta_rule.triton_op:gated_delta_rule_triton",
    ),
    validate=matrix_state_checks("scalar", beta=True),
    counts=Counts(counts.delta_forward, counts.FWDBWD_CHUNKED, decode_flops),
    inputs=inputs.factory(gates, initial_state=inputs.matrix_state),
    fla={"default": FlaKernel("chunk_gated_delta_rule", "fla.ops:gated_delta_rule.chunk_gated_delta_rule",
                              lambda kernel, a: kernel(a["q"], a["k"], a["v"], a["g"], a["beta"])[0])},
)
