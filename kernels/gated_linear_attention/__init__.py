"""Gated linear attention: h_t = diag(exp(g_t)) h_{t-1} + k_t v_t^T, o_t = h_t^T (scale q_t)
(docs/design.md §3). g: [B, T, H] (scalar decay per head) or [B, T, H, K] (GLA: one per key channel).

Backends: reference (per-token recurrence), torch (chunked, autograd), triton.
"""

from __future__ import annotations

import torch

from kernels.common.spec import dispatch
from kernels.common.step import check_step, linear_step
from kernels.gated_linear_attention.spec import SPEC
from kernels.gated_linear_attention.step import gated_linear_attention_step_unchecked

OP = "gated_linear_attention"


def gated_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
    chunk_size: int = 64,
    check_values: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Causal gated linear attention.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] or [B, T, H, K], log space (<= 0,
    decay = exp(g)); scale multiplies q (default K ** -0.5); initial_state: [B, H, K, V] or
    None (zeros). backend: "auto" | "reference" | "torch" | "triton". Returns o:
    [B, T, H, V] in q's dtype and, if output_final_state, the final state [B, H, K, V]
    (fp32; fp64 for fp64 inputs), else None.

    check_values: check g <= 0 on the host, a device sync and, under torch.compile (where it
    is skipped, as under CUDA-graph capture), a graph break. Pass False where the caller
    guarantees the values, e.g. g = logsigmoid(...) by construction. Shapes, dtypes and
    devices are always checked.
    """
    return dispatch(
        SPEC, backend, check_values, q=q, k=k, v=v, g=g, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, chunk_size=chunk_size,
    )


def gated_linear_attention_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor,
    state: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding token. q_t, k_t: [B, H, K]; v_t: [B, H, V]; g_t: [B, H] or [B, H, K]
    (<= 0); state: [B, H, K, V] or None (zeros). Returns (o_t [B, H, V] in q_t's dtype,
    new state [B, H, K, V] fp32/fp64). backend: see kernels.common.dispatch.resolve_step_backend."""
    op = OP + "_step"
    scale = check_step(op, q_t, k_t, v_t, state, scale, gate="scalar_or_vector", g_t=g_t).scale
    return linear_step(op, backend, lambda: gated_linear_attention_step_unchecked(q_t, k_t, v_t, g_t, state, scale),
                       q_t, k_t, v_t, g_t, None, state, scale)


__all__ = ["gated_linear_attention", "gated_linear_attention_step"]
