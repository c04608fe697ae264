"""MesaNet, chunkwise in plain PyTorch: the "torch" backend (docs/design.md §8, §10).

Per chunk of C tokens, with Q the scaled queries, Gamma the intra-chunk decay and H0, S0 the
H_kk, H_kv entering the chunk:

    Q* = solve(M_i, q_i) for every token i, by conjugate gradient on all tokens at once
         (the mat-vec of kernels/mesa/system.py; no per-token K x K matrix is ever built)
    O  = diag(e^gamma) Q* S0 + ((Q* K^T) ⊙ Gamma diag(beta)) V

and the states pass from chunk to chunk. Gradients do not go through the CG iterations:
`_MesaSolve` is an autograd.Function with the implicit-function backward. For x = M^{-1} b
with M symmetric and a loss L, let y = M^{-1} dL/dx (a second CG). Then
    dL/db = y,     dL/dM = -y x^T   (per token),
and since every M_i is linear in (H0, k k^T, beta, lamb) through the mat-vec, the gradient
for k, beta, g, lamb and H0 is that of the scalar  -sum_i y_i^T M_i x_i  with x and y
held fixed, in closed form (ChunkSystem.bilinear_grads): no autograd call nests inside the
backward, so torch.compile traces the whole training step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from kernels.common.chunking import merge_chunks, split_chunks
from kernels.mesa.cg import conjugate_gradient
from kernels.mesa.state import MesaState, compute_dtype
from kernels.mesa.system import ChunkSystem, build_system, chunk_start_states


@dataclass(frozen=True)
class CGOptions:
    """How the forward and the adjoint CG solves run: `steps` iterations at most, stopping
    early when every relative residual is below `tol` (None: always `steps`)."""

    steps: int
    tol: float | None = None


class _MesaSolve(torch.autograd.Function):
    """q* = M^{-1} b for every token of every chunk, M held implicitly (see module doc).

    b: [B, H, N, C, K]; the system's tensors as ChunkSystem holds them: decay [B, H, N, C],
    h0 [B, H, N, K, K], keys [B, H, N, C, K], gamma_beta [B, H, N, C, C], lamb [H, K].
    Autograd carries the gradients of decay and gamma_beta on to g and beta.
    """

    @staticmethod
    def forward(ctx, b, decay, h0, keys, gamma_beta, lamb, options: CGOptions):
        system = ChunkSystem(decay, h0, keys, gamma_beta, lamb)
        q_star = conjugate_gradient(system.matvec, b, system.jacobi_start(b), options.steps, options.tol)
        ctx.save_for_backward(q_star, decay, h0, keys, gamma_beta, lamb)
        ctx.options = options
        return q_star

    @staticmethod
    @once_differentiable
    def backward(ctx, d_q_star):
        q_star, *fields = ctx.saved_tensors
        options: CGOptions = ctx.options
        system = ChunkSystem(*fields)
        adjoint = conjugate_gradient(system.matvec, d_q_star, system.jacobi_start(d_q_star),
                                     options.steps, options.tol)
        grads = system.bilinear_grads(adjoint, q_star, tuple(ctx.needs_input_grad[1:6]))
        return (adjoint, *[None if g is None else -g for g in grads], None)


def mesa_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    lamb: torch.Tensor,
    scale: float,
    initial_state: MesaState | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    cg_steps: int = 30,
    cg_tol: float | None = None,
) -> tuple[torch.Tensor, MesaState | None]:
    """Chunkwise MesaNet with a CG solve and an implicit (adjoint CG) backward.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g, beta: [B, T, H]; lamb: [H, K] > 0;
    initial_state: MesaState(h_kk [B, H, K, K], h_kv [B, H, K, V]) or None.
    Arguments are assumed validated (see kernels.mesa.mesa). Computes in fp32 (fp64 for
    fp64 inputs) whatever the input dtype; returns o [B, T, H, V] in q's dtype and, if asked,
    the final MesaState in the compute dtype. The chunk is min(chunk_size, T); T is
    zero-padded to a multiple of it.
    """
    T = q.shape[1]
    cdt = compute_dtype(q, k, v)
    chunk = min(chunk_size, T)
    queries = split_chunks(q.to(cdt) * scale, chunk)  # [B, H, N, C, K]
    keys = split_chunks(k.to(cdt), chunk)
    values = split_chunks(v.to(cdt), chunk)
    beta_c = split_chunks(beta.to(cdt), chunk)  # [B, H, N, C]
    g_c = split_chunks(g.to(cdt), chunk)
    h_kk0, h_kv0, final = chunk_start_states(keys, values, beta_c, g_c, initial_state)

    system = build_system(keys, beta_c, g_c, lamb.to(cdt), h_kk0)
    options = CGOptions(steps=cg_steps, tol=cg_tol)
    q_star = _MesaSolve.apply(queries, system.decay, system.h0, system.keys, system.gamma_beta,
                              system.lamb, options)

    from_state = system.decay[..., None] * (q_star @ h_kv0)
    within_chunk = ((q_star @ keys.transpose(-1, -2)) * system.gamma_beta) @ values
    o = merge_chunks(from_state + within_chunk, T).to(q.dtype)
    return o, (final if output_final_state else None)
