"""MesaNet backward, per chunk (docs/design.md §8, §10): gradients of k, v, beta and g from the
solutions Q* (forward) and Y (adjoint), dO and the gradients dH', dS' of the two states
leaving the chunk (kernels/mesa/triton_states.py).

With W_ij = Gamma_ij beta_j (i >= j), u_j = beta_j e^{g_{j+1} + ... + g_C}:
    dW_ij = (q*_i . k_j) (v_j . do_i) - (y_i . k_j) (q*_i . k_j)       (output; dM_i = -y_i q*_i^T)
    dk_j  = sum_i W_ij [((v_j . do_i) - (y_i . k_j)) q*_i - (q*_i . k_j) y_i]
            + u_j ((dH' + dH'^T) k_j + dS' v_j)
    dv_j  = sum_i W_ij (q*_i . k_j) do_i + u_j dS'^T k_j
    du_j  = k_j^T dH' k_j + k_j^T dS' v_j
    dbeta_j = sum_i dW_ij Gamma_ij + e^{g_{j+1} + ... + g_C} du_j
and, since W_ij holds g_s exactly for j < s <= i, d_i for s <= i, u_j for s > j and the
chunk decay every g_s of the chunk,
    dg_s = sum_{i >= s, j < s} dW_ij W_ij + sum_{i >= s} e_i + sum_{j < s} du_j u_j + c <S, dS'>
with e_i the gradient of log d_i (triton_solve.py) and c <S, dS'> the chunk-decay term.
These are sums of the terms themselves, never differences of cumulative sums, so no
digits cancel. The [BT, BT] matrices are held transposed (row j: key, column i: query) so
that no dot ever takes tl.trans of another dot's result (miscompiled on Hopper by Triton
3.4 to 3.7.0, flash-linear-attention issue 640).

One program per chunk and head. dk and du are formed over blocks of BC key columns
(GradsLaunch.BC, the whole K by default): each step reads its [K, BC] columns of dH' + dH'^T
and its BC rows of dS', so below the whole K the [K, K] state gradient is never held at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.launch import GradsLaunch
from kernels.common.triton.tiles import load_tile, load_tile_t, store_tile
from kernels.common.triton.utils import new_buffer, warps
from kernels.mesa.triton_system import decay_to_end, load_gates


@triton.jit(do_not_specialize=["T", "NT", "H"])
def mesa_bwd_grads_kernel(
    k, v, g, beta, q_star, y, do, dh_kk, dh_kv, e, decay_grad, dk, dv, dbeta, dg, T, NT,
    H, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr,
):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    t0 = i_t * BT
    chunk = (i_bh * NT + i_t).to(tl.int64)
    o_j = tl.arange(0, BT)
    m_j = t0 + o_j < T
    m_lower_t = o_j[:, None] <= o_j[None, :]  # [j, i]: j <= i
    b_g, b_beta = load_gates(g, beta, seq, t0, T, H, BT)
    # [j, i] = g_{j+1} + ... + g_i: a running sum along i of g_s for s > j (a scan, no FMA dot)
    b_after = tl.where(o_j[:, None] < o_j[None, :], b_g[None, :], 0.0)
    b_gamma_t = tl.where(m_lower_t, tl.exp2(tl.cumsum(b_after, axis=1)), 0.0)
    b_to_end, _ = decay_to_end(b_g, BT)
    b_u = b_beta * b_to_end

    b_k = load_tile(k + seq * K, t0, 0, T, K, H * K, BT, BK).to(tl.float32)
    # [j, i] = Gamma_ij (q*_i . k_j): zero above the diagonal through Gamma
    b_kxg = b_gamma_t * tl.dot(b_k, load_tile_t(q_star + seq * K, t0, 0, T, K, H * K, BT, BK),
                               input_precision=PREC)
    # [j, i] = (v_j . do_i) - (y_i . k_j), the (y . k) part first so that no third tile waits
    b_vmy = -tl.dot(b_k, load_tile_t(y + seq * K, t0, 0, T, K, H * K, BT, BK), input_precision=PREC)
    # tiles are re-read rather than kept live across loops (registers)
    for i_v in range(tl.cdiv(V, BV)):
        b_v = load_tile(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV).to(tl.float32)
        b_do_t = load_tile_t(do + seq * V, t0, i_v * BV, T, V, H * V, BT, BV).to(tl.float32)
        b_vmy += tl.dot(b_v, b_do_t, input_precision=PREC)
        b_do = load_tile(do + seq * V, t0, i_v * BV, T, V, H * V, BT, BV).to(tl.float32)
        b_ds = load_tile(dh_kv + chunk * K * V, 0, i_v * BV, K, V, V, BK, BV)
        b_ku = load_tile(k + seq * K, t0, 0, T, K, H * K, BT, BK).to(tl.float32) * b_u[:, None]
        b_dv = (tl.dot(b_kxg * b_beta[:, None], b_do, input_precision=PREC)
                + tl.dot(b_ku, b_ds, input_precision=PREC))
        store_tile(dv + seq * V, b_dv, t0, i_v * BV, T, V, H * V, BT, BV)

    # dW_ij Gamma_ij and the gate-gradient pairs dW_ij W_ij (j < i) need (q* . k), (v . do) -
    # (y . k) and Gamma together; they are formed here, so that the key-column loop below
    # holds two [BT, BT] tiles, not four (spills, sm_90 screen)
    b_dw_gamma_t = b_kxg * b_vmy  # [j, i] = dW_ij Gamma_ij, zero above the diagonal
    b_dbeta = tl.sum(b_dw_gamma_t, axis=1)
    b_pairs_t = tl.where(o_j[:, None] < o_j[None, :], b_dw_gamma_t * b_beta[:, None], 0.0)  # [j, i], j < i
    b_later = tl.cumsum(b_pairs_t, axis=1, reverse=True)  # [j, s] = sum_{i >= s} P_ji
    b_dg = tl.sum(tl.where(o_j[:, None] < o_j[None, :], b_later, 0.0), axis=0)  # sum_{j < s}
    b_e = tl.load(e + seq + (t0 + o_j) * H, mask=m_j, other=0.0)
    b_dg += tl.cumsum(b_e, axis=0, reverse=True)  # sum_{i >= s} e_i
    b_vmy_w = b_vmy * b_gamma_t * b_beta[:, None]  # [j, i] = ((v_j . do_i) - (y_i . k_j)) W_ij
    b_kx_w = b_kxg * b_beta[:, None]  # [j, i] = (q*_i . k_j) W_ij
    # dk and du over blocks of BC key columns: rows (dH' + dH'^T) k_j and dS' v_j, column by
    # column block, so that the [K, K] state gradient is never held whole
    b_du = tl.zeros([BT], dtype=tl.float32)
    for i_c in range(tl.cdiv(K, BC)):
        c0 = i_c * BC
        b_k = load_tile(k + seq * K, t0, 0, T, K, H * K, BT, BK).to(tl.float32)
        b_dh_sym = (load_tile(dh_kk + chunk * K * K, 0, c0, K, K, K, BK, BC)
                    + load_tile_t(dh_kk + chunk * K * K, c0, 0, K, K, K, BC, BK))  # (dH' + dH'^T)[:, c]
        b_z = tl.dot(b_k, b_dh_sym, input_precision=PREC)
        b_kc = load_tile(k + seq * K, t0, c0, T, K, H * K, BT, BC).to(tl.float32)
        b_du += 0.5 * tl.sum(b_kc * b_z, axis=1)
        b_zv = tl.zeros([BT, BC], dtype=tl.float32)
        for i_v in range(tl.cdiv(V, BV)):
            b_v = load_tile(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV).to(tl.float32)
            b_ds_t = load_tile_t(dh_kv + chunk * K * V, c0, i_v * BV, K, V, V, BC, BV)  # dS'[c, v]^T
            b_zv += tl.dot(b_v, b_ds_t, input_precision=PREC)
        b_du += tl.sum(b_kc * b_zv, axis=1)
        b_dk = b_u[:, None] * (b_z + b_zv)
        b_x = load_tile(q_star + seq * K, t0, c0, T, K, H * K, BT, BC)
        b_dk += tl.dot(b_vmy_w, b_x, input_precision=PREC)
        b_yy = load_tile(y + seq * K, t0, c0, T, K, H * K, BT, BC)
        b_dk -= tl.dot(b_kx_w, b_yy, input_precision=PREC)
        store_tile(dk + seq * K, b_dk, t0, c0, T, K, H * K, BT, BC)

    b_dbeta += b_to_end * b_du
    tl.store(dbeta + seq + (t0 + o_j) * H, b_dbeta, mask=m_j)
    b_dg += tl.sum(tl.where(o_j[None, :] < o_j[:, None], (b_du * b_u)[None, :], 0.0), axis=1)
    b_dg += tl.load(decay_grad + chunk)
    tl.store(dg + seq + (t0 + o_j) * H, b_dg, mask=m_j)


def mesa_bwd_grads(
    k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, q_star: torch.Tensor,
    y: torch.Tensor, do: torch.Tensor, dh_kk: torch.Tensor, dh_kv: torch.Tensor, e: torch.Tensor,
    decay_grad: torch.Tensor, chunk_size: int, prec: str, launch: GradsLaunch = GradsLaunch(),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dk [B, T, H, K] (k's dtype), dv [B, T, H, V] (v's dtype), dbeta and dg [B, T, H] fp32.

    k, q_star, y: [B, T, H, K]; v, do: [B, T, H, V]; g, beta, e: [B, T, H]; dh_kk:
    [B, H, NT, K, K], dh_kv: [B, H, NT, K, V] fp32 gradients of the states leaving each
    chunk; decay_grad: [B, H, NT] fp32, the chunk-decay gradients of both states summed.
    launch: warps and the key-column block of dk (GradsLaunch.BC, at most the whole K)."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    BK = max(16, triton.next_power_of_2(K))
    BV = max(16, min(64, triton.next_power_of_2(V)))
    BC = min(BK, launch.BC)
    dk = new_buffer((B, T, H, K), k.dtype, k.device)
    dv = new_buffer((B, T, H, V), v.dtype, v.device)
    dbeta = new_buffer((B, T, H), torch.float32, k.device)
    dg = new_buffer((B, T, H), torch.float32, k.device)
    mesa_bwd_grads_kernel[(NT, B * H)](
        k, v, g, beta, q_star, y, do, dh_kk, dh_kv, e, decay_grad.contiguous(), dk, dv, dbeta, dg, T, NT,
        H=H, K=K, V=V, BT=chunk_size, BK=BK, BV=BV, BC=BC, PREC=prec, num_warps=warps(launch.num_warps),
        num_stages=launch.num_stages,
    )
    return dk, dv, dbeta, dg
