"""Linear attention: h_t = h_{t-1} + k_t v_t^T, o_t = h_t^T (scale q_t) (docs/design.md §3).

Backends: reference (per-token recurrence), torch (chunked, autograd), triton.
"""

from __future__ import annotations

import torch

from kernels.common.checks import check_qkv, check_state, check_step_qkv, default_scale
from kernels.common.chunking import check_chunk_size
from kernels.common.dispatch import resolve_backend, resolve_step_backend
from kernels.linear_attention.chunked import linear_attention_chunked
from kernels.linear_attention.reference import linear_attention_reference
from kernels.linear_attention.step import linear_attention_step_unchecked

OP = "linear_attention"


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
    chunk_size: int = 64,
    check_values: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Causal linear attention.

    q, k: [B, T, H, K]; v: [B, T, H, V]; scale multiplies q (default K ** -0.5);
    initial_state: [B, H, K, V] or None (zeros). backend: "auto" | "reference" | "torch" |
    "triton". Returns o: [B, T, H, V] in q's dtype and, if output_final_state, the final
    state [B, H, K, V] (fp32; fp64 for fp64 inputs), else None.

    check_values: accepted so that every op takes it; this op has no values to check (its
    shape, dtype and device checks read no data).
    """
    B, T, H, K, V = check_qkv(OP, q, k, v)
    check_state(OP, "initial_state", initial_state, (B, H, K, V), device=q.device)
    scale = default_scale(OP, scale, K)
    check_chunk_size(OP, chunk_size)
    backend = resolve_backend(OP, backend, q.device, q.dtype)
    if backend == "reference":
        return linear_attention_reference(q, k, v, scale, initial_state, output_final_state)
    if backend == "torch":
        return linear_attention_chunked(q, k, v, scale, initial_state, output_final_state, chunk_size)
    if backend == "triton":
        from kernels.linear_attention.triton_op import linear_attention_triton  # lazy: triton is optional

        return linear_attention_triton(
            q, k, v, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, chunk_size=chunk_size,
        )
    raise AssertionError(f"resolve_backend returned an unhandled backend {backend!r}")


def linear_attention_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    state: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding token. q_t, k_t: [B, H, K]; v_t: [B, H, V]; state: [B, H, K, V] or
    None (zeros). Returns (o_t [B, H, V] in q_t's dtype, new state [B, H, K, V] fp32/fp64).
    backend: see kernels.common.dispatch.resolve_step_backend."""
    op = OP + "_step"
    B, H, K, V = check_step_qkv(op, q_t, k_t, v_t)
    check_state(op, "state", state, (B, H, K, V))
    scale = default_scale(op, scale, K)
    if resolve_step_backend(op, backend, [q_t, k_t, v_t, state]) == "triton":
        from kernels.common.triton.step import fused_step  # lazy: triton is optional

        return fused_step(q_t, k_t, v_t, None, None, state, scale)
    return linear_attention_step_unchecked(q_t, k_t, v_t, state, scale)


__all__ = ["linear_attention", "linear_attention_step"]
