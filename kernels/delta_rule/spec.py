"""The OpSpec of the delta rule (DeltaNet; kernels.common.spec)."""

from __future__ import annotations

from typing import Any

from kernels.common import counts, inputs
from kernels.common.checks import matrix_state_checks
from kernels.common.spec import Counts, FlaKernel, OpSpec, chunked_backends
from kernels.delta_rule.chunked import chunk_delta_rule
from kernels.delta_rule.reference import delta_rule_reference


def decode_flops(B: int, H: int, K: int, V: int, context: int) -> float:
    # k^T h (2KV), h -= beta k (k^T h - v)^T (2KV), o = h^T q (2KV).
    return float(B * H * 6 * K * V)


def beta(draw: inputs.Draw, B: int, T: int, H: int, K: int, V: int, variant: str) -> dict[str, Any]:
    return {"beta": inputs.write_strength(draw, B, T, H)}


SPEC = OpSpec(
    name="delta_rule",
    function="kernels.delta_rule:delta_rule",
    step="kernels.delta_rule:delta_rule_step",
    state="h: [B, H, K, V] tensor (fp32; fp64 for fp64 inputs)",
    backends=chunked_backends(
        delta_rule_reference, chunk_delta_rule,
        "kernels.delta_rule.triton_op:delta_rule_triton",
    ),
    validate=matrix_state_checks("none", beta=True),
    counts=Counts(counts.delta_forward, counts.FWDBWD_CHUNKED, decode_flops),
    inputs=inputs.factory(beta, initial_state=inputs.matrix_state),
    fla={"default": FlaKernel("chunk_delta_rule", "fla.ops:delta_rule.chunk_delta_rule",
                              lambda kernel, a: kernel(a["q"], a["k"], a["v"], a["beta"])[0])},
)
