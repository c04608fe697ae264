"""Triton backend of mesa (arguments already validated by kernels.mesa.mesa)."""

from __future__ import annotations

import torch

from kernels.common.triton.utils import check_chunk_size
from kernels.mesa.state import MesaState
from kernels.mesa.triton_function import MesaFunction, MesaOptions

MAX_K = 128  # the CG kernels hold a chunk's K x K state on-chip


def mesa_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    lamb: torch.Tensor,
    *,
    scale: float,
    initial_state: MesaState | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    cg_steps: int = 30,
    cg_tol: float | None = None,
) -> tuple[torch.Tensor, MesaState | None]:
    """Chunkwise MesaNet on Triton, forward and backward.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g, beta: [B, T, H]; lamb: [H, K] > 0;
    initial_state: MesaState(h_kk [B, H, K, K], h_kv [B, H, K, V]) or None. K <= 128, any V
    and T. Per chunk, cg_steps conjugate-gradient iterations from the Jacobi start; with
    cg_tol a chunk's rows stop early once all their relative residuals are below it.
    fp16/bf16/fp32 inputs compute with fp32 states and iterates; fp64 inputs are computed
    in fp32. Returns o [B, T, H, V] in q's dtype and the final MesaState (fp32; fp64 for
    fp64 inputs) or None. Gradients flow to q, k, v, g, beta, lamb and the initial state.
    """
    check_chunk_size("mesa", chunk_size)
    K = q.shape[-1]
    if K > MAX_K:
        raise ValueError(f"mesa: backend='triton' supports K <= {MAX_K}, got K={K}; use backend='torch'")
    out_dtype = q.dtype
    compute = torch.float32 if out_dtype == torch.float64 else out_dtype
    q, k, v = (t.to(compute).contiguous() for t in (q, k, v))
    g, beta = g.contiguous(), beta.contiguous()
    h_kk0 = h_kv0 = None
    if initial_state is not None:
        h_kk0 = initial_state.h_kk.float().contiguous()
        h_kv0 = initial_state.h_kv.float().contiguous()
    opts = MesaOptions(
        scale=float(scale), chunk_size=chunk_size, cg_steps=int(cg_steps),
        cg_tol=None if cg_tol is None else float(cg_tol), output_final_state=output_final_state,
    )
    o, ht_kk, ht_kv = MesaFunction.apply(q, k, v, g, beta, lamb.float().contiguous(), h_kk0, h_kv0, opts)
    final = None
    if output_final_state:
        state_dtype = torch.float64 if out_dtype == torch.float64 else torch.float32
        final = MesaState(ht_kk.to(state_dtype), ht_kv.to(state_dtype))
    return o.to(out_dtype), final
