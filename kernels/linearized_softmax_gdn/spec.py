"""The OpSpecs of the linearized softmax GDN and of its baseline VaLA (kernels.common.spec)."""

from __future__ import annotations

from typing import Any

import torch

from kernels.common import counts, inputs
from kernels.common.checks import check_qkv, default_scale
from kernels.common.chunking import check_chunk_size
from kernels.common.spec import Backend, Counts, OpSpec, chunked_backends
from kernels.linearized_softmax_gdn.chunked import chunk_linearized_softmax_gdn
from kernels.linearized_softmax_gdn.reference import linearized_softmax_gdn_reference
from kernels.linearized_softmax_gdn.state import LinGDNState, check_lin_state
from kernels.linearized_softmax_gdn.vala import vala_reference, vala_torch


def validate(op: str, args: dict[str, Any], check_values: bool) -> dict[str, Any]:
    """q, k, v, initial_state (a LinGDNState), chunk_size and scale; no values to check."""
    B, T, H, K, V = check_qkv(op, args["q"], args["k"], args["v"])
    check_lin_state(op, "initial_state", args["initial_state"], B, H, K, V)
    check_chunk_size(op, args["chunk_size"])
    args["scale"] = default_scale(op, args["scale"], K)
    return args


def decode_flops(B: int, H: int, K: int, V: int, context: int) -> float:
    # the gated delta rule's step (7KV) after O(K + V) running means.
    return float(B * H * 7 * K * V)


def vala_decode_flops(B: int, H: int, K: int, V: int, context: int) -> float:
    # the linear-attention step (4KV) on centred keys and values.
    return float(B * H * 4 * K * V)


def running_sums(draw: inputs.Draw, B: int, H: int, K: int, V: int) -> LinGDNState:
    """A state after 7 tokens: small h, sums of 7 unit-scale keys and values."""
    return LinGDNState(inputs.matrix_state(draw, B, H, K, V), 2.0 * draw.normal(B, H, K), 2.0 * draw.normal(B, H, V), 7)


SPEC = OpSpec(
    name="linearized_softmax_gdn",
    function="kernels.linearized_softmax_gdn:linearized_softmax_gdn",
    step="kernels.linearized_softmax_gdn:linearized_softmax_gdn_step",
    state="LinGDNState(h [B, H, K, V], k_sum [B, H, K], v_sum [B, H, V], count) (fp32; fp64 for fp64 inputs)",
    backends=chunked_backends(
        linearized_softmax_gdn_reference, chunk_linearized_softmax_gdn,
        "kernels.linearized_softmax_gdn.triton_op:linearized_softmax_gdn_triton",
    ),
    validate=validate,
    counts=Counts(counts.delta_forward, counts.FWDBWD_CHUNKED, decode_flops),
    inputs=inputs.factory(initial_state=running_sums),
)


def validate_vala(op: str, args: dict[str, Any], check_values: bool) -> dict[str, Any]:
    """q, k, v and scale."""
    B, T, H, K, V = check_qkv(op, args["q"], args["k"], args["v"])
    args["scale"] = default_scale(op, args["scale"], K)
    return args


def _vala_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, None]:
    return vala_reference(q, k, v, scale), None


def _vala_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, None]:
    return vala_torch(q, k, v, scale), None


VALA_SPEC = OpSpec(
    name="vala_attention",
    function="kernels.linearized_softmax_gdn:vala_attention",
    step=None,
    state="none (the op returns None for its state)",
    backends={"reference": Backend(_vala_reference), "torch": Backend(_vala_torch)},
    auto=lambda device, dtype: "torch",  # its torch form runs on every device; there is no Triton kernel
    validate=validate_vala,
    counts=Counts(counts.linear_forward, counts.FWDBWD_CHUNKED, vala_decode_flops),  # linear attention, centred
    inputs=inputs.factory(),
    role="baseline",
)
