"""MesaNet (docs/design.md §8): the public op `mesa`, its decode step `mesa_step` and `MesaState`.

    H_kk_t = exp(g_t) H_kk_{t-1} + beta_t k_t k_t^T      H_kv_t = exp(g_t) H_kv_{t-1} + beta_t k_t v_t^T
    q*_t = (H_kk_t + diag(lamb))^{-1} (scale q_t)         o_t = H_kv_t^T q*_t
"""

from __future__ import annotations

import torch

from kernels.common.spec import dispatch
from kernels.common.step import check_step
from kernels.mesa.checks import check_lamb, check_mesa_state
from kernels.mesa.spec import SPEC
from kernels.mesa.state import MesaState
from kernels.mesa.step import mesa_step_compute

__all__ = ["MesaState", "mesa", "mesa_step"]


def mesa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    lamb: torch.Tensor,
    scale: float | None = None,
    initial_state: MesaState | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
    chunk_size: int = 64,
    cg_steps: int = 30,
    cg_tol: float | None = None,
    check_values: bool = True,
) -> tuple[torch.Tensor, MesaState | None]:
    """MesaNet over a sequence.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] log-decay (<= 0); beta: [B, T, H] in
    (0, 1]; lamb: [H, K] ridge > 0; initial_state: MesaState(h_kk [B, H, K, K], h_kv
    [B, H, K, V]) or None. backend: "auto" (triton on CUDA, else torch), "reference" (exact
    solve per token), "torch" (chunked, CG) or "triton". chunk_size, cg_steps (CG iterations,
    >= 0) and cg_tol (stop once every relative residual is below it) apply to the CG
    backends. Returns o [B, T, H, V] in q's dtype and the final MesaState (fp32; fp64 for
    fp64 inputs) when output_final_state, else None.

    check_values: check g <= 0, beta in (0, 1] and lamb finite and > 0 on the host, a device
    sync and, under torch.compile (where they are skipped, as under CUDA-graph capture), a
    graph break. Pass False where the caller guarantees the values, e.g. gates from
    parametrisations valid by construction. Shapes, dtypes and devices are always checked.
    With cg_tol the torch backend's CG stops on a device read, so under torch.compile that
    call runs eagerly (a graph break); leave cg_tol None for a whole graph.
    """
    return dispatch(
        SPEC, backend, check_values, q=q, k=k, v=v, g=g, beta=beta, lamb=lamb, scale=scale,
        initial_state=initial_state, output_final_state=output_final_state, chunk_size=chunk_size,
        cg_steps=cg_steps, cg_tol=cg_tol,
    )


def mesa_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor,
    beta_t: torch.Tensor,
    lamb: torch.Tensor,
    state: MesaState | None,
    scale: float | None = None,
    cg_steps: int | None = None,
) -> tuple[torch.Tensor, MesaState]:
    """One decoding token. q_t, k_t: [B, H, K]; v_t: [B, H, V]; g_t: [B, H] (<= 0);
    beta_t: [B, H] in (0, 1]; lamb: [H, K] > 0; state: MesaState or None (zeros).

    The solve is exact (torch.linalg.solve) unless cg_steps is given, then that many CG
    iterations from the Jacobi start. Returns o_t [B, H, V] in q_t's dtype and the new
    MesaState (fp32; fp64 for fp64 inputs).
    """
    op = "mesa_step"

    def lamb_then_state(op: str, state, B: int, H: int, K: int, V: int) -> MesaState | None:
        check_lamb(op, "lamb", lamb, H, K)
        return check_mesa_state(op, "state", state, B, H, K, V)

    checked = check_step(op, q_t, k_t, v_t, state, scale, gate="scalar", g_t=g_t, beta=True, beta_t=beta_t,
                         state_check=lamb_then_state)
    if cg_steps is not None and (not isinstance(cg_steps, int) or cg_steps < 0):
        raise ValueError(f"{op}: cg_steps must be None (exact solve) or an int >= 0, got {cg_steps!r}")
    return mesa_step_compute(q_t, k_t, v_t, g_t, beta_t, lamb, checked.state, checked.scale, cg_steps)
