"""Gated delta rule (Gated DeltaNet): the public op and its decode step; checks and backends are in spec.py."""

from __future__ import annotations

import torch

from kernels.common.spec import dispatch
from kernels.gated_delta_rule.spec import SPEC
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
    return dispatch(
        SPEC, backend, check_values, q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, chunk_size=chunk_size,
    )
