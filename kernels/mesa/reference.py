"""MesaNet, token by token with an exact solve per token: the ground truth (docs/design.md §8).

    H_kk_t = exp(g_t) H_kk_{t-1} + beta_t k_t k_t^T
    H_kv_t = exp(g_t) H_kv_{t-1} + beta_t k_t v_t^T
    q*_t   = (H_kk_t + diag(lamb))^{-1} (scale q_t),     o_t = H_kv_t^T q*_t
"""

from __future__ import annotations

import torch

from kernels.mesa.state import MesaState, compute_dtype


def mesa_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    lamb: torch.Tensor,
    scale: float,
    initial_state: MesaState | None = None,
    output_final_state: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, MesaState | None]:
    """Per-token recurrence, differentiable through torch.linalg.solve.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g, beta: [B, T, H]; lamb: [H, K] (> 0).
    Arguments are assumed validated (see kernels.mesa.mesa). Computes in fp32, or fp64
    when an input is fp64 or dtype=torch.float64. Returns o [B, T, H, V] in q's dtype
    (the compute dtype when dtype is given) and, if asked, the final MesaState in the compute dtype.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    cdt = compute_dtype(q, k, v, dtype=dtype)
    out_dtype = cdt if dtype is not None else q.dtype
    q, k, v = (scale * q.to(cdt)), k.to(cdt), v.to(cdt)
    decay, beta = g.to(cdt).exp(), beta.to(cdt)
    lamb_diag = torch.diag_embed(lamb.to(cdt))  # [H, K, K]
    if initial_state is None:
        h_kk = q.new_zeros(B, H, K, K)
        h_kv = q.new_zeros(B, H, K, V)
    else:
        h_kk, h_kv = initial_state.h_kk.to(cdt), initial_state.h_kv.to(cdt)
    outputs = []
    for t in range(T):
        k_t, v_t, b_t = k[:, t], v[:, t], beta[:, t, :, None, None]
        a_t = decay[:, t, :, None, None]
        h_kk = a_t * h_kk + b_t * (k_t[..., :, None] * k_t[..., None, :])
        h_kv = a_t * h_kv + b_t * (k_t[..., :, None] * v_t[..., None, :])
        q_star = torch.linalg.solve(h_kk + lamb_diag, q[:, t, ..., None])  # [B, H, K, 1]
        outputs.append((h_kv.transpose(-1, -2) @ q_star)[..., 0])
    o = torch.stack(outputs, dim=1).to(out_dtype)
    final = MesaState(h_kk, h_kv) if output_final_state else None
    return o, final

