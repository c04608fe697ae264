"""The OpSpec of gated linear attention (kernels.common.spec): a scalar gate [B, T, H] or a
vector gate [B, T, H, K], the input variants "vector" and "scalar"."""

from __future__ import annotations

from typing import Any

from kernels.common import counts, inputs
from kernels.common.checks import matrix_state_checks
from kernels.common.spec import Counts, FlaKernel, OpSpec, chunked_backends
from kernels.gated_linear_attention.chunked import gated_linear_attention_chunked
from kernels.gated_linear_attention.reference import gated_linear_attention_reference


def decode_flops(B: int, H: int, K: int, V: int, context: int) -> float:
    # decay h (KV) + the linear-attention step (4KV).
    return float(B * H * 5 * K * V)


def gate(draw: inputs.Draw, B: int, T: int, H: int, K: int, V: int, variant: str) -> dict[str, Any]:
    return {"g": inputs.log_gate(draw, B, T, H, K, "scalar" if variant == "scalar" else "vector")}


def variant_of(args) -> str:
    return "vector" if args["g"].dim() == 4 else "scalar"


SPEC = OpSpec(
    name="gated_linear_attention",
    function="kernels.gated_linear_attention:gated_linear_attention",
    step="kernels.gated_linear_attention:gated_linear_attention_step",
    state="h: [B, H, K, V] tensor (fp32; fp64 for fp64 inputs)",
    backends=chunked_backends(
        gated_linear_attention_reference, gated_linear_attention_chunked,
        "kernels.gated_linear_attention.triton_op:gated_linear_attention_triton",
    ),
    validate=matrix_state_checks("scalar_or_vector", beta=False),
    counts=Counts(counts.linear_forward, counts.FWDBWD_CHUNKED, decode_flops),
    inputs=inputs.factory(gate, initial_state=inputs.matrix_state),
    variants=("vector", "scalar"),
    variant_of=variant_of,
    fla={
        "vector": FlaKernel("chunk_gla", "fla.ops:gla.chunk_gla",
                            lambda kernel, a: kernel(a["q"], a["k"], a["v"], a["g"])[0]),
        "scalar": FlaKernel("chunk_simple_gla", "fla.ops:simple_gla.chunk_simple_gla",
                            lambda kernel, a: kernel(a["q"], a["k"], a["v"], g=a["g"])[0]),
    },
)
