"""The OpSpec of linear attention (kernels.common.spec)."""

from __future__ import annotations

from typing import Any

from kernels.common import counts, inputs
from kernels.common.checks import matrix_state_checks
from kernels.common.spec import Counts, FlaKernel, OpSpec, chunked_backends
from kernels.linear_attention.chunked import linear_attention_chunked
from kernels.linear_attention.reference import linear_attention_reference


def decode_flops(B: int, H: int, K: int, V: int, context: int) -> float:
    # h += k v^T (2KV); o = h^T q (2KV).
    return float(B * H * 4 * K * V)


def fla_call(kernel, args: dict[str, Any]):
    # FLA divides by q . sum(k) itself when asked (the linear mixer's normalize).
    return kernel(args["q"], args["k"], args["v"], normalize=bool(args.get("normalize", False)))[0]


SPEC = OpSpec(
    name="linear_attention",
    function="kernels.linear_attention:linear_attention",
    step="kernels.linear_attention:linear_attention_step",
    state="h: [B, H, K, V] tensor (fp32; fp64 for fp64 inputs)",
    backends=chunked_backends(
        linear_attention_reference, linear_attention_chunked,
        "kernels.linear_attention.triton_op:linear_attention_triton",
    ),
    validate=matrix_state_checks("none", beta=False),
    counts=Counts(counts.linear_forward, counts.FWDBWD_CHUNKED, decode_flops),
    inputs=inputs.factory(initial_state=inputs.matrix_state),
    fla={"default": FlaKernel("chunk_linear_attn", "fla.ops:linear_attn.chunk_linear_attn", fla_call, ("normalize",))},
)
