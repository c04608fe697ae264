"""MesaNet, one token at a time for decoding.

The solve is exact by default (torch.linalg.solve on the K x K system per head: for one
token that costs about as much as a few CG iterations and is as accurate as the reference).
With cg_steps=n it runs n CG iterations from the Jacobi start instead, as the chunked
forward does, for decoding that matches a model trained with a short CG.
"""

from __future__ import annotations

import torch

from kernels.mesa.cg import conjugate_gradient
from kernels.mesa.state import MesaState, compute_dtype


def mesa_step_compute(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor,
    beta_t: torch.Tensor,
    lamb: torch.Tensor,
    state: MesaState | None,
    scale: float,
    cg_steps: int | None = None,
) -> tuple[torch.Tensor, MesaState]:
    """One token. q_t, k_t: [B, H, K]; v_t: [B, H, V]; g_t, beta_t: [B, H]; lamb: [H, K];
    state: MesaState(h_kk [B, H, K, K], h_kv [B, H, K, V]) or None (zeros).

    Arguments are assumed validated (see kernels.mesa.mesa_step). Returns o_t [B, H, V] in
    q_t's dtype and the new state in fp32 (fp64 for fp64 inputs).
    """
    B, H, K = q_t.shape
    cdt = compute_dtype(q_t, k_t, v_t)
    query, key, value = q_t.to(cdt) * scale, k_t.to(cdt), v_t.to(cdt)
    decay = g_t.to(cdt).exp()[..., None, None]
    weight = beta_t.to(cdt)[..., None, None]
    if state is None:
        h_kk = query.new_zeros(B, H, K, K)
        h_kv = query.new_zeros(B, H, K, value.shape[-1])
    else:
        h_kk, h_kv = state.h_kk.to(cdt), state.h_kv.to(cdt)
    h_kk = decay * h_kk + weight * (key[..., :, None] * key[..., None, :])
    h_kv = decay * h_kv + weight * (key[..., :, None] * value[..., None, :])
    lamb_c = lamb.to(cdt)
    if cg_steps is None:
        q_star = torch.linalg.solve(h_kk + torch.diag_embed(lamb_c), query[..., None])[..., 0]
    else:

        def matvec(p: torch.Tensor) -> torch.Tensor:
            return (h_kk @ p[..., None])[..., 0] + lamb_c * p

        start = query / (h_kk.diagonal(dim1=-2, dim2=-1) + lamb_c)
        q_star = conjugate_gradient(matvec, query, start, cg_steps)
    o_t = (h_kv.transpose(-1, -2) @ q_star[..., None])[..., 0]
    return o_t.to(q_t.dtype), MesaState(h_kk, h_kv)
