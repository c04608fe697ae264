"""Gated delta rule (Gated DeltaNet): the public op, its checks and backend dispatch."""

from __future__ import annotations

import torch

from kernels.common.checks import check_beta, check_gate, check_qkv, check_state, default_scale
from kernels.common.chunking import check_chunk_size
from kernels.common.dispatch import resolve_backend
from kernels.gated_delta_rule.chunked import chunk_gated_delta_rule
from kernels.gated_delta_rule.reference import gated_delta_rule_reference
from kernels.gated_delta_rule.step import gated_delta_rule_step

__all__ = ["gated_delta_rule", "gated_delta_rule_step"]


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
    chunk_size: int = 64,
    check_values: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule, per head: h_t = exp(g_t) (I - beta_t k_t k_t^T) h_{t-1} + beta_t k_t v_t^T,
    o_t = h_t^T (scale q_t).

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] log-space decay (<= 0);
    beta: [B, T, H] in (0, 1]; scale defaults to K ** -0.5; initial_state: [B, H, K, V].
    Returns o: [B, T, H, V] in the input dtype and the final state [B, H, K, V] (fp32,
    fp64 for fp64 inputs) when output_final_state, else None.

    Keys need not be unit norm. The transition I - beta_t k_t k_t^T is a contraction iff
    0 <= beta_t ||k_t||^2 <= 2; beyond that the state (and the chunked form's triangular
    inverse) can grow without bound. L2-normalised keys with beta in (0, 1] are always safe.

    backend: "auto" (triton on CUDA, torch elsewhere), "reference" (per-token loop),
    "torch" (chunkwise, autograd) or "triton"; chunk_size is the chunk length of the
    chunkwise backends.

    check_values: check g <= 0 and beta in (0, 1] on the host, a device sync and, under
    torch.compile (where they are skipped, as under CUDA-graph capture), a graph break. Pass
    False where the caller guarantees the values, e.g. g = -exp(A) softplus(...) and
    beta = sigmoid(...) by construction. Shapes, dtypes and devices are always checked.
    """
    op = "gated_delta_rule"
    B, T, H, K, V = check_qkv(op, q, k, v)
    check_gate(op, g, B, T, H, K, allow_vector=False, device=q.device, check_values=check_values)
    check_beta(op, beta, B, T, H, device=q.device, check_values=check_values)
    check_state(op, "initial_state", initial_state, (B, H, K, V), device=q.device)
    check_chunk_size(op, chunk_size)
    scale = default_scale(op, scale, K)
    backend = resolve_backend(op, backend, q.device, q.dtype)
    if backend == "reference":
        return gated_delta_rule_reference(
            q, k, v, g, beta, scale, initial_state=initial_state, output_final_state=output_final_state
        )
    if backend == "torch":
        return chunk_gated_delta_rule(
            q, k, v, g, beta, scale, initial_state=initial_state,
            output_final_state=output_final_state, chunk_size=chunk_size,
        )
    from kernels.gated_delta_rule.triton_op import gated_delta_rule_triton  # lazy: triton is optional

    return gated_delta_rule_triton(
        q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, chunk_size=chunk_size,
    )
