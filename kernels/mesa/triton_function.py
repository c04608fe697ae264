"""The autograd Function behind backend="triton" of mesa (docs/design.md §8, §10).

Forward:  H_kk, H_kv entering every chunk              (triton_states.mesa_fwd_states, x2)
          Q*, O per chunk: CG on-chip, then the output   (triton_solve.mesa_fwd_solve)
Backward: Y = M^{-1} dX (adjoint CG), dq, e, dlamb       (triton_solve.mesa_bwd_solve)
          dH' (from -Y Q*^T), dS' (from Q* dO^T) per chunk, dh0s, chunk-decay terms
                                                         (triton_states.mesa_bwd_states, x2)
          dk, dv, dbeta, dg                              (triton_grads.mesa_bwd_grads)

States, CG iterates and every accumulation are fp32. Dot precision: "ieee" (true fp32) for
fp32 inputs; for fp16/bf16 inputs the launch settings pick it (MesaLaunch in
kernels/common/launch/: tf32 tensor cores by default, about 5e-4 relative per product,
far below bf16's rounding; tf32x3 is about fp32 but needs more shared memory than a CG
program of 64 rows has). The forward runs under the settings in effect for "mesa" and
keeps them in ctx.launch for the backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.common.launch import MesaLaunch, note_launch
from kernels.mesa.triton_grads import mesa_bwd_grads
from kernels.mesa.triton_solve import mesa_bwd_solve, mesa_fwd_solve
from kernels.mesa.triton_states import mesa_bwd_states, mesa_fwd_states


@dataclass(frozen=True)
class MesaOptions:
    """Non-tensor arguments of the op (validated by the caller)."""

    scale: float
    chunk_size: int
    cg_steps: int
    cg_tol: float | None
    output_final_state: bool


def _precisions(dtype: torch.dtype, launch: MesaLaunch) -> tuple[str, str]:
    """(prec, cg_prec) for inputs of `dtype`."""
    if dtype == torch.float32:
        return "ieee", "ieee"
    return launch.prec, launch.cg_prec


class MesaFunction(torch.autograd.Function):
    """(q, k, v, g, beta, lamb, h_kk0 | None, h_kv0 | None, MesaOptions) -> (o, h_kk_T | None, h_kv_T | None).

    q, k: [B, T, H, K]; v: [B, T, H, V] (one dtype: fp16, bf16 or fp32, contiguous); g, beta:
    [B, T, H] (any float dtype); lamb: [H, K] fp32; h_kk0: [B, H, K, K], h_kv0: [B, H, K, V]
    fp32 or None. o in v's dtype; final states fp32.
    """

    @staticmethod
    def forward(ctx, q, k, v, g, beta, lamb, h_kk0, h_kv0, opts: MesaOptions):
        BT = opts.chunk_size
        launch = ctx.launch = note_launch("mesa")
        prec, cg_prec = _precisions(q.dtype, launch)
        states = launch.states
        h_kk, ht_kk = mesa_fwd_states(k, k, g, beta, h_kk0, opts.output_final_state, BT, prec, states)
        h_kv, ht_kv = mesa_fwd_states(k, v, g, beta, h_kv0, opts.output_final_state, BT, prec, states)
        q_star, o = mesa_fwd_solve(
            q, k, v, g, beta, lamb, h_kk, h_kv, opts.scale, opts.cg_steps, opts.cg_tol, BT, prec, cg_prec,
            launch=launch.fwd_solve,
        )
        ctx.save_for_backward(k, v, g, beta, lamb, h_kk, h_kv, q_star)
        ctx.opts = opts
        ctx.q_dtype = q.dtype
        ctx.has_h0 = (h_kk0 is not None, h_kv0 is not None)
        ctx.set_materialize_grads(False)
        return o, ht_kk, ht_kv

    @staticmethod
    def backward(ctx, do, dht_kk, dht_kv):
        k, v, g, beta, lamb, h_kk, h_kv, q_star = ctx.saved_tensors
        opts: MesaOptions = ctx.opts
        BT = opts.chunk_size
        launch: MesaLaunch = ctx.launch
        prec, cg_prec = _precisions(ctx.q_dtype, launch)
        do = torch.zeros_like(v) if do is None else do.to(v.dtype).contiguous()
        y, dq, e, dlamb = mesa_bwd_solve(
            k, v, g, beta, lamb, h_kk, h_kv, q_star, do, opts.scale, opts.cg_steps, opts.cg_tol, BT, prec,
            cg_prec, ctx.q_dtype, launch=launch.bwd_solve,
        )
        states = launch.states
        # K x K state: its chunk term is -(Y ⊙ d)^T Q*; K x V state: (Q* ⊙ d)^T dO
        dh_kk, dh_kk0, decay_kk = mesa_bwd_states(y, q_star, g, h_kk, dht_kk, -1.0, ctx.has_h0[0], BT, prec, states)
        dh_kv, dh_kv0, decay_kv = mesa_bwd_states(q_star, do, g, h_kv, dht_kv, 1.0, ctx.has_h0[1], BT, prec, states)
        dk, dv, dbeta, dg = mesa_bwd_grads(
            k, v, g, beta, q_star, y, do, dh_kk, dh_kv, e, decay_kk + decay_kv, BT, prec,
            launch=launch.grads,
        )
        return dq, dk, dv, dg.to(g.dtype), dbeta.to(beta.dtype), dlamb, dh_kk0, dh_kv0, None
