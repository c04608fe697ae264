"""The autograd Function behind backend="triton" of mesa (docs/design.md §8, §10).

Forward:  H_kk, H_kv entering every chunk              (triton_states.mesa_fwd_states, x2)
          Q*, O per chunk: CG on-chip, then the output   (triton_solve.mesa_fwd_solve)
Backward: Y = M^{-1} dX (adjoint CG), dq, e, dlamb       (triton_solve.mesa_bwd_solve)
          dH' (from -Y Q*^T), dS' (from Q* dO^T) per chunk, dh0s, chunk-decay terms
                                                         (triton_states.mesa_bwd_states, x2)
          dk, dv, dbeta, dg                              (triton_grads.mesa_bwd_grads)

States, CG iterates and every accumulation are fp32. Dot precision: "ieee" (true fp32) for
fp32 inputs; for fp16/bf16 inputs TUNING picks it (tf32 tensor cores by default: about
5e-4 relative per product, far below bf16's rounding; tf32x3 is about fp32 but needs more
shared memory than a CG program of 64 rows has).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.mesa.triton_grads import mesa_bwd_grads
from kernels.mesa.triton_solve import SolveLaunch, mesa_bwd_solve, mesa_fwd_solve
from kernels.mesa.triton_states import StateLaunch, mesa_bwd_states, mesa_fwd_states

# Launch settings and dot precisions for 16-bit inputs; benchmarks may override entries.
# Defaults from the H200 sweep of 2026-11-29 (results/bench/h200_mesa.json, sweep_T8192):
# solve kernels fwd / bwd at T = 8192: 34.0 / 40.3 ms (rows 64, streaming, fp32 prologue: 572
# and 554 spilled registers) -> 34.0 / 41.7 (resident) -> 28.4 / 29.8 (rows 32) -> 25.8 / 27.1
# (rows 32 with both prologue options, 24 / 12 spills; the streaming form, since removed,
# was the first). Against it on the GPU: q* 3.1e-5, o 8.9e-4 (bf16 rounding), y 6.9e-5.
TUNING: dict[str, object] = {
    "cg_prec": "tf32",  # tl.dot precision inside the CG loops
    "prec": "tf32",  # every other dot (states, outputs, gradients)
    "rows": 64,  # rows (tokens) per forward CG program: the chunk, or half of it (fewer registers)
    # 1: the CG programs' segment sums of gates by a running sum (tl.cumsum) instead of an
    # fp32 FMA product with a 0/1 matrix: the same terms, another order; a cheaper prologue.
    "weights_scan": 1,
    # "cg": diag(M), which only sets the Jacobi start, at cg_prec on tensor cores; "ieee":
    # fp32 FMAs (a BR x BT x K product in every CG program's prologue). fp32 inputs: ieee.
    "diag_prec": "cg",
    # "fp16_scaled": the CG mat-vecs on fp16 operands scaled per row / per tile (tf32's 11
    # significant bits at twice its tensor-core rate, half the registers); "fp16_normed": the
    # same with each row scaled by a norm bound the CG loop carries (no row-max reductions;
    # rows that converged past fp32's range are dropped, NORM_FLOOR in triton_system.py);
    # "fp32": tf32 (or ieee) dots on fp32 tiles. H200, solve kernels at T = 8192, rows 64 fwd /
    # 32 bwd: fwd / bwd 14.8 / 20.4 ms (fp16_scaled) -> 12.1 / 16.2 (fp16_normed); fp32 operands
    # at 32 rows 25.7 / 27.1. q* moved by 4.8e-5, o by 1.1e-3, y by 1.0e-4 (fp16_normed vs
    # fp16_scaled; results/bench/h200_mesa.json, session 5, with every GPU test passing)
    "cg_operands": "fp16_normed",
    "bwd_rows": 32,  # rows per program of the backward's CG (rows: the forward's)
    "solve_warps": 8,
    # the state passes (triton_states.StateLaunch): widest row / column blocks, the narrowest
    # column block used to reach states_min_programs programs per multiprocessor, warps, stages
    # H200, both passes, fwd / bwd ms: T = 2048 (B*H = 512) 1.62 / 2.55 at 64 x 64 -> 1.14 / 2.09
    # at 128 rows; T = 32768 (B*H = 32) 2.37 / 4.59 -> 2.25 / 3.57 (states_sweep, session 5)
    "states_BK": 128,
    "states_BD": 64,
    "states_min_BD": 16,
    "states_min_programs": 2,
    "state_warps": 4,
    "states_stages": 2,
    "grads_warps": 8,
}


@dataclass(frozen=True)
class MesaOptions:
    """Non-tensor arguments of the op (validated by the caller)."""

    scale: float
    chunk_size: int
    cg_steps: int
    cg_tol: float | None
    output_final_state: bool


def _precisions(dtype: torch.dtype) -> tuple[str, str]:
    """(prec, cg_prec) for inputs of `dtype`."""
    if dtype == torch.float32:
        return "ieee", "ieee"
    return str(TUNING["prec"]), str(TUNING["cg_prec"])


class MesaFunction(torch.autograd.Function):
    """(q, k, v, g, beta, lamb, h_kk0 | None, h_kv0 | None, MesaOptions) -> (o, h_kk_T | None, h_kv_T | None).

    q, k: [B, T, H, K]; v: [B, T, H, V] (one dtype: fp16, bf16 or fp32, contiguous); g, beta:
    [B, T, H] (any float dtype); lamb: [H, K] fp32; h_kk0: [B, H, K, K], h_kv0: [B, H, K, V]
    fp32 or None. o in v's dtype; final states fp32.
    """

    @staticmethod
    def forward(ctx, q, k, v, g, beta, lamb, h_kk0, h_kv0, opts: MesaOptions):
        BT = opts.chunk_size
        prec, cg_prec = _precisions(q.dtype)
        states = StateLaunch.from_tuning(TUNING)
        h_kk, ht_kk = mesa_fwd_states(k, k, g, beta, h_kk0, opts.output_final_state, BT, prec, states)
        h_kv, ht_kv = mesa_fwd_states(k, v, g, beta, h_kv0, opts.output_final_state, BT, prec, states)
        q_star, o = mesa_fwd_solve(
            q, k, v, g, beta, lamb, h_kk, h_kv, opts.scale, opts.cg_steps, opts.cg_tol, BT, prec, cg_prec,
            launch=SolveLaunch.from_tuning(TUNING),
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
        prec, cg_prec = _precisions(ctx.q_dtype)
        do = torch.zeros_like(v) if do is None else do.to(v.dtype).contiguous()
        y, dq, e, dlamb = mesa_bwd_solve(
            k, v, g, beta, lamb, h_kk, h_kv, q_star, do, opts.scale, opts.cg_steps, opts.cg_tol, BT, prec,
            cg_prec, ctx.q_dtype, launch=SolveLaunch.from_tuning(TUNING, backward=True),
        )
        states = StateLaunch.from_tuning(TUNING)
        # K x K state: its chunk term is -(Y ⊙ d)^T Q*; K x V state: (Q* ⊙ d)^T dO
        dh_kk, dh_kk0, decay_kk = mesa_bwd_states(y, q_star, g, h_kk, dht_kk, -1.0, ctx.has_h0[0], BT, prec, states)
        dh_kv, dh_kv0, decay_kv = mesa_bwd_states(q_star, do, g, h_kv, dht_kv, 1.0, ctx.has_h0[1], BT, prec, states)
        dk, dv, dbeta, dg = mesa_bwd_grads(
            k, v, g, beta, q_star, y, do, dh_kk, dh_kv, e, decay_kk + decay_kv, BT, prec,
            num_warps=int(TUNING["grads_warps"]),
        )
        return dq, dk, dv, dg.to(g.dtype), dbeta.to(beta.dtype), dlamb, dh_kk0, dh_kv0, None
