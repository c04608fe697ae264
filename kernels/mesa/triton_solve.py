"""MesaNet's per-chunk solves in Triton (docs/design.md §8, §10): the forward CG with the output,
and the adjoint CG of the backward. One program owns BR rows (tokens) of one chunk of one
head and runs every CG iteration on-chip (kernels/mesa/triton_system.py), so iterations cost
no launches; it loads H0^T and the chunk's keys once, before the CG loop, and keeps them on
chip.

Forward (H0, S0: the K x K and K x V states entering the chunk):
    Q*  = M^{-1} (scale Q)   row by row, from the Jacobi start
    O   = diag(d) Q* S0 + ((Q* K^T) ⊙ W) V
Backward of the solve (M_i symmetric), per row:
    dX  = diag(d) dO S0^T + ((dO V^T) ⊙ W) K        (gradient of q*)
    Y   = M^{-1} dX                                   (adjoint CG: dq = scale Y)
    e_i = d_i (q*_i . (S0 do_i) - y_i . (H0 q*_i))    (gradient of log d_i, for dg)
    dlamb = -sum_i y_i ⊙ q*_i                         (one partial sum per program)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.launch import SOLVE_OPERANDS, SolveLaunch
from kernels.common.triton.tiles import load_tile, load_tile_t, store_tile
from kernels.common.triton.utils import new_buffer, warps
from kernels.mesa.triton_system import cg_solve, load_system

# The compiled kernel of each wrapper's latest launch ("fwd", "bwd"; None under the
# interpreter): benchmarks read n_regs, n_spills and metadata.shared from it.
LAST_COMPILED: dict[str, object] = {}


@triton.jit(do_not_specialize=["T", "NT", "steps", "H"])
def mesa_fwd_solve_kernel(
    q, k, v, g, beta, lamb, h_kk, h_kv, q_star, o, scale, tol2, T, NT, steps,
    H, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BR: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, HAS_TOL: tl.constexpr, PREC: tl.constexpr, CG_PREC: tl.constexpr,
    SCAN: tl.constexpr, DIAG_PREC: tl.constexpr, HALF: tl.constexpr,
):
    i_r, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    t0 = i_t * BT
    r0 = t0 + i_r * BR
    chunk = (i_bh * NT + i_t).to(tl.int64)
    p_h0 = h_kk + chunk * K * K
    b_w, b_d, b_lamb, b_diag, b_h0t, b_k = load_system(k, g, beta, lamb, p_h0, seq, t0, i_r * BR, i_h, T,
                                                       H, K, BT, BR, BK, SCAN, DIAG_PREC)
    b_b = load_tile(q + seq * K, r0, 0, T, K, H * K, BR, BK).to(tl.float32) * scale
    b_x = cg_solve(b_b, b_h0t, b_k, b_w, b_d, b_lamb, b_diag, steps, tol2, HAS_TOL, CG_PREC, HALF)
    b_kt = tl.trans(b_k)
    store_tile(q_star + seq * K, b_x, r0, 0, T, K, H * K, BR, BK)
    b_a = tl.dot(b_x, b_kt, input_precision=PREC) * b_w  # [BR, BT]
    for i_v in range(tl.cdiv(V, BV)):
        b_s = load_tile(h_kv + chunk * K * V, 0, i_v * BV, K, V, V, BK, BV)
        b_v = load_tile(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV).to(tl.float32)
        b_o = tl.dot(b_x, b_s, input_precision=PREC) * b_d[:, None] + tl.dot(b_a, b_v, input_precision=PREC)
        store_tile(o + seq * V, b_o, r0, i_v * BV, T, V, H * V, BR, BV)


@triton.jit(do_not_specialize=["T", "NT", "steps", "H"])
def mesa_bwd_solve_kernel(
    k, v, g, beta, lamb, h_kk, h_kv, q_star, do, y, dq, e, dlamb, scale, tol2, T, NT, steps,
    H, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BR: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, HAS_TOL: tl.constexpr, PREC: tl.constexpr, CG_PREC: tl.constexpr,
    SCAN: tl.constexpr, DIAG_PREC: tl.constexpr, HALF: tl.constexpr,
):
    i_r, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    t0 = i_t * BT
    r0 = t0 + i_r * BR
    chunk = (i_bh * NT + i_t).to(tl.int64)
    p_h0 = h_kk + chunk * K * K
    b_x = load_tile(q_star + seq * K, r0, 0, T, K, H * K, BR, BK)
    b_dx_state = tl.zeros([BR, BK], dtype=tl.float32)  # rows S0 do_i
    b_dov = tl.zeros([BR, BT], dtype=tl.float32)  # do_i . v_j
    for i_v in range(tl.cdiv(V, BV)):
        b_do = load_tile(do + seq * V, r0, i_v * BV, T, V, H * V, BR, BV).to(tl.float32)
        b_st = load_tile_t(h_kv + chunk * K * V, 0, i_v * BV, K, V, V, BK, BV)  # [BV, BK]
        b_vt = load_tile_t(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV).to(tl.float32)  # [BV, BT]
        b_dx_state += tl.dot(b_do, b_st, input_precision=PREC)
        b_dov += tl.dot(b_do, b_vt, input_precision=PREC)
    # loaded after the loop over V, so the resident tiles add nothing to its registers
    b_w, b_d, b_lamb, b_diag, b_h0t, b_k = load_system(k, g, beta, lamb, p_h0, seq, t0, i_r * BR, i_h, T,
                                                       H, K, BT, BR, BK, SCAN, DIAG_PREC)
    b_e = b_d * tl.sum(b_x * b_dx_state, axis=1)  # output part of e, before q* leaves registers
    b_dx = b_dx_state * b_d[:, None] + tl.dot(b_dov * b_w, b_k, input_precision=PREC)
    b_y = cg_solve(b_dx, b_h0t, b_k, b_w, b_d, b_lamb, b_diag, steps, tol2, HAS_TOL, CG_PREC, HALF)
    store_tile(y + seq * K, b_y, r0, 0, T, K, H * K, BR, BK)
    store_tile(dq + seq * K, b_y * scale, r0, 0, T, K, H * K, BR, BK)
    # q* is read again rather than kept live through the CG loop (registers)
    b_x = load_tile(q_star + seq * K, r0, 0, T, K, H * K, BR, BK)
    b_xh = tl.dot(b_x, b_h0t, input_precision=PREC)  # rows (H0 q*_i)^T
    b_e -= b_d * tl.sum(b_y * b_xh, axis=1)
    o_r = r0 + tl.arange(0, BR)
    tl.store(e + seq + o_r * H, b_e, mask=o_r < T)
    o_k = tl.arange(0, BK)
    part = (i_b * NT + i_t) * tl.num_programs(0) + i_r
    tl.store(dlamb + (part.to(tl.int64) * H + i_h) * K + o_k, -tl.sum(b_y * b_x, axis=0), mask=o_k < K)


def solve_constexprs(launch: SolveLaunch, cg_prec: str) -> dict:
    """The CG kernels' constexprs for `launch` at CG dot precision cg_prec: SCAN, DIAG_PREC
    and HALF (the index of launch.operands in SOLVE_OPERANDS; 0, fp32 operands, when
    cg_prec is "ieee": fp32 inputs keep true fp32 products)."""
    return {"SCAN": launch.weights_scan,
            "DIAG_PREC": cg_prec if launch.diag_cg_prec else "ieee",
            "HALF": SOLVE_OPERANDS.index(launch.operands) if cg_prec != "ieee" else 0}


def _tol2(tol: float | None) -> float:
    """tol^2, capped so that it stays finite in fp32 (inf * 0 in padded rows would be NaN)."""
    return 0.0 if tol is None else min(float(tol) ** 2, 1e38)


def _launch_shape(q: torch.Tensor, v: torch.Tensor, chunk_size: int, launch: SolveLaunch) -> tuple:
    B, T, H, K = q.shape
    V = v.shape[-1]
    BK = max(16, triton.next_power_of_2(K))
    BR = min(launch.rows_for(BK), chunk_size)
    BV = max(16, min(64, triton.next_power_of_2(V)))
    NT = triton.cdiv(T, chunk_size)
    return B, T, H, K, V, BR, BK, BV, NT, (chunk_size // BR, NT, B * H)


def mesa_fwd_solve(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, lamb: torch.Tensor,
    h_kk: torch.Tensor, h_kv: torch.Tensor, scale: float, steps: int, tol: float | None, chunk_size: int,
    prec: str, cg_prec: str, launch: SolveLaunch = SolveLaunch(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """q*, o for every token. q, k: [B, T, H, K]; v: [B, T, H, V]; g, beta: [B, T, H];
    lamb: [H, K] fp32; h_kk: [B, H, NT, K, K], h_kv: [B, H, NT, K, V] fp32 states entering
    each chunk. Returns q_star [B, T, H, K] fp32 and o [B, T, H, V] in v's dtype."""
    B, T, H, K, V, BR, BK, BV, NT, grid = _launch_shape(q, v, chunk_size, launch)
    q_star = new_buffer((B, T, H, K), torch.float32, q.device)
    o = new_buffer((B, T, H, V), v.dtype, v.device)
    LAST_COMPILED["fwd"] = mesa_fwd_solve_kernel[grid](
        q, k, v, g, beta, lamb, h_kk, h_kv, q_star, o, float(scale), _tol2(tol), T, NT, steps,
        H=H, K=K, V=V, BT=chunk_size, BR=BR, BK=BK, BV=BV, HAS_TOL=tol is not None, PREC=prec, CG_PREC=cg_prec,
        **solve_constexprs(launch, cg_prec), num_warps=warps(launch.warps_for(BK)), num_stages=1,
    )
    return q_star, o


def mesa_bwd_solve(
    k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, lamb: torch.Tensor,
    h_kk: torch.Tensor, h_kv: torch.Tensor, q_star: torch.Tensor, do: torch.Tensor, scale: float,
    steps: int, tol: float | None, chunk_size: int, prec: str, cg_prec: str, q_dtype: torch.dtype,
    launch: SolveLaunch = SolveLaunch(),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Adjoint solve. Arguments as in mesa_fwd_solve, plus q_star [B, T, H, K] fp32 and
    do [B, T, H, V]. Returns y [B, T, H, K] fp32, dq [B, T, H, K] in q_dtype, e [B, T, H]
    fp32 (gradient of each log d_i) and dlamb [H, K] fp32."""
    B, T, H, K, V, BR, BK, BV, NT, grid = _launch_shape(q_star, v, chunk_size, launch)
    y = new_buffer((B, T, H, K), torch.float32, k.device)
    dq = new_buffer((B, T, H, K), q_dtype, k.device)
    e = new_buffer((B, T, H), torch.float32, k.device)
    dlamb = new_buffer((B * NT * grid[0], H, K), torch.float32, k.device)
    LAST_COMPILED["bwd"] = mesa_bwd_solve_kernel[grid](
        k, v, g, beta, lamb, h_kk, h_kv, q_star, do, y, dq, e, dlamb, float(scale), _tol2(tol),
        T, NT, steps, H=H, K=K, V=V, BT=chunk_size, BR=BR, BK=BK, BV=BV, HAS_TOL=tol is not None,
        PREC=prec, CG_PREC=cg_prec, **solve_constexprs(launch, cg_prec), num_warps=warps(launch.warps_for(BK)), num_stages=1,
    )
    return y, dq, e, dlamb.sum(0)
