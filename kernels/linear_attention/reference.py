"""Linear attention, per-token recurrence (the ground truth of every test).

    h_t = h_{t-1} + k_t v_t^T          o_t = h_t^T (scale q_t)
"""

from __future__ import annotations

import torch


def accumulation_dtype(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.dtype:
    """fp64 when x is fp64 or fp64 is requested, else fp32 (the dtype references compute in)."""
    if dtype not in (None, torch.float32, torch.float64):
        raise ValueError(f"dtype must be None, torch.float32 or torch.float64, got {dtype}")
    return torch.float64 if torch.float64 in (x.dtype, dtype) else torch.float32


def linear_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token linear attention; differentiable by autograd.

    q, k: [B, T, H, K]; v: [B, T, H, V]; initial_state: [B, H, K, V] or None (zeros).
    Computes in fp32, or fp64 for fp64 inputs / dtype=torch.float64.
    Returns o: [B, T, H, V] in q's dtype (fp64 when dtype=torch.float64) and the final
    state [B, H, K, V] in the computing dtype (None unless output_final_state).
    """
    acc = accumulation_dtype(q, dtype)
    out_dtype = acc if dtype == torch.float64 else q.dtype
    B, T, H, K = q.shape
    q, k, v = q.to(acc) * scale, k.to(acc), v.to(acc)
    h = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(acc)
    outputs = []
    for t in range(T):
        h = h + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append((q[:, t, :, :, None] * h).sum(dim=-2))  # h^T q_t
    o = torch.stack(outputs, dim=1).to(out_dtype)
    return o, (h if output_final_state else None)
