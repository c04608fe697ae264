"""Gated linear attention, per-token recurrence (the ground truth of every test).

    h_t = diag(exp(g_t)) h_{t-1} + k_t v_t^T          o_t = h_t^T (scale q_t)

g_t is a scalar per head ([B, T, H]: Mamba2/RetNet-style decay) or one log-decay per key
channel ([B, T, H, K]: GLA).
"""

from __future__ import annotations

import torch

from kernels.linear_attention.reference import accumulation_dtype


def gated_linear_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token gated linear attention; differentiable by autograd.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] or [B, T, H, K], log space (<= 0);
    initial_state: [B, H, K, V] or None (zeros). Computes in fp32, or fp64 for fp64
    inputs / dtype=torch.float64. Returns o: [B, T, H, V] in q's dtype (fp64 when
    dtype=torch.float64) and the final state [B, H, K, V] in the computing dtype (None
    unless output_final_state).
    """
    acc = accumulation_dtype(q, dtype)
    out_dtype = acc if dtype == torch.float64 else q.dtype
    B, T, H, K = q.shape
    q, k, v = q.to(acc) * scale, k.to(acc), v.to(acc)
    decay = torch.exp(g.to(acc))
    # Broadcast the decay over the rows of h (vector gate) or over all of h (scalar gate).
    decay = decay[..., None] if g.dim() == 4 else decay[..., None, None]
    h = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(acc)
    outputs = []
    for t in range(T):
        h = decay[:, t] * h + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append((q[:, t, :, :, None] * h).sum(dim=-2))  # h^T q_t
    o = torch.stack(outputs, dim=1).to(out_dtype)
    return o, (h if output_final_state else None)
