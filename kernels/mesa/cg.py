"""Batched conjugate gradient for MesaNet's per-token systems, and a convergence probe.

Every vector along the last axis is its own symmetric positive-definite system; all of them
take the same number of iterations (no data-dependent control flow except the optional
tolerance check, which stops only when every system has converged).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kernels.common.checks import graph_capturing
from kernels.common.chunking import split_chunks
from kernels.mesa.state import MesaState
from kernels.mesa.system import build_system, chunk_start_states


def conjugate_gradient(
    matvec: Callable[[torch.Tensor], torch.Tensor],
    b: torch.Tensor,
    x0: torch.Tensor,
    steps: int,
    tol: float | None = None,
    on_iterate: Callable[[int, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Solve M x = b for every vector along the last axis of b [..., K] from x0 [..., K].

    Runs `steps` iterations; with `tol`, stops earlier once ||b - M x|| <= tol ||b|| for every
    system (a host sync per iteration). on_iterate(i, x) sees the iterate after i steps,
    i = 0 (the start) .. the last. Divisions are guarded so an exactly converged system
    (zero residual) stays put instead of producing 0/0.
    """
    if tol is not None and graph_capturing(b):
        raise ValueError("mesa CG: a tolerance stops on a device read, which CUDA-graph capture forbids; "
                         "use cg_tol=None (a fixed number of steps) when the step is graphed")
    tiny = torch.finfo(b.dtype).tiny
    x = x0.clone()
    r = b - matvec(x)
    p = r.clone()
    rr = (r * r).sum(-1, keepdim=True)
    stop_rr = None if tol is None else (tol * tol) * (b * b).sum(-1, keepdim=True)
    if on_iterate is not None:
        on_iterate(0, x)
    for i in range(1, steps + 1):
        if stop_rr is not None and bool((rr <= stop_rr).all()):
            break
        mp = matvec(p)
        alpha = rr / (p * mp).sum(-1, keepdim=True).clamp_min(tiny)
        x = x + alpha * p
        r = r - alpha * mp
        rr_next = (r * r).sum(-1, keepdim=True)
        p = r + (rr_next / rr.clamp_min(tiny)) * p
        rr = rr_next
        if on_iterate is not None:
            on_iterate(i, x)
    return x


@torch.no_grad()
def cg_residual_curve(
    q: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    lamb: torch.Tensor,
    iteration_counts: Sequence[int],
    scale: float | None = None,
    initial_state: MesaState | None = None,
    chunk_size: int = 64,
) -> dict[int, float]:
    """Relative error of the chunked CG solve q* after n iterations, for each n given.

    q, k: [B, T, H, K]; g, beta: [B, T, H]; lamb: [H, K]; initial_state: only h_kk is used.
    CG runs as the torch backend runs it (fp32, or fp64 for fp64 inputs, Jacobi start);
    the exact q*_t = (H_kk_t + diag(lamb))^{-1} scale q_t is solved in fp64 with every M_t
    built explicitly, one chunk at a time. Returns {n: ||q*_n - q*|| / ||q*||} over all
    tokens, B and H (n = 0 is the starting point alone).
    """
    K = q.shape[-1]
    scale = K**-0.5 if scale is None else float(scale)
    wanted = sorted({int(n) for n in iteration_counts})
    if not wanted or wanted[0] < 0:
        raise ValueError(f"cg_residual_curve: iteration_counts must be >= 0, got {list(iteration_counts)}")
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    exact = _exact_solution(q, k, g, beta, lamb, scale, initial_state, chunk_size)
    system, b = _system(q, k, g, beta, lamb, scale, initial_state, chunk_size, cdt)
    exact_norm = exact.norm().item()
    errors: dict[int, float] = {}

    def record(i: int, x: torch.Tensor) -> None:
        if i in wanted:
            errors[i] = (x.double() - exact).norm().item() / max(exact_norm, 1e-300)

    conjugate_gradient(system.matvec, b, system.jacobi_start(b), wanted[-1], on_iterate=record)
    return {n: errors[n] for n in wanted}


def _system(q, k, g, beta, lamb, scale, initial_state, chunk_size, dtype):
    """The chunk systems and right-hand sides of the torch backend, in `dtype`."""
    chunk = min(chunk_size, q.shape[1])
    b = split_chunks(q.to(dtype) * scale, chunk)
    keys = split_chunks(k.to(dtype), chunk)
    g_c = split_chunks(g.to(dtype), chunk)
    beta_c = split_chunks(beta.to(dtype), chunk)
    h0, _, _ = chunk_start_states(keys, None, beta_c, g_c, initial_state)
    return build_system(keys, beta_c, g_c, lamb.to(dtype), h0), b


def _exact_solution(q, k, g, beta, lamb, scale, initial_state, chunk_size) -> torch.Tensor:
    """fp64 q* for every token, [B, H, N, C, K], from explicit M_t (one chunk at a time)."""
    system, b = _system(q, k, g, beta, lamb, scale, initial_state, chunk_size, torch.float64)
    lamb_diag = torch.diag_embed(system.lamb)[:, None]  # [H, 1, K, K]
    solutions = []
    for n in range(b.shape[2]):
        keys = system.keys[:, :, n]  # [B, H, C, K]
        within = torch.einsum("bhij,bhjk,bhjl->bhikl", system.gamma_beta[:, :, n], keys, keys)
        m = system.decay[:, :, n, :, None, None] * system.h0[:, :, n, None] + within + lamb_diag
        solutions.append(torch.linalg.solve(m, b[:, :, n, :, :, None])[..., 0])
    return torch.stack(solutions, dim=2)
