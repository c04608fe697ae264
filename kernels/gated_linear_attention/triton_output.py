"""Per-chunk output and value gradient (docs/design.md §10), given the states at chunk boundaries.

Forward, chunk by chunk in parallel (S: state entering the chunk):
    O = scale (Q ⊙ e^gamma) S + A V,    A = scale (Q K^T ⊙ Gamma), lower triangle incl. diagonal
Backward (dS': gradient of the state leaving the chunk):
    dV = A^T dO + (K ⊙ e^{gamma_C - gamma}) dS'

A is computed in the kernel for ungated and scalar-gated chunks (Gamma_ij = e^{gamma_i -
gamma_j}); a vector gate passes it precomputed ([B, T, H, BT] fp32, scale and gates
included), since its intra-chunk part needs sub-chunks (kernels/gated_linear_attention).
The delta-rule kernels reuse `chunk_fwd_output` with their pseudo-values U in place of V.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.triton.tiles import load_gamma_rows, load_row, load_tile, load_tile_t, store_tile
from kernels.common.triton.utils import block_size, chunk_launch, dot_precision, new_buffer, warps


@triton.jit
def chunk_fwd_output_kernel(
    q, k, v, h, gamma, A, o, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, HAS_A: tl.constexpr, DOT_PREC: tl.constexpr,
):
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    state = (i_bh * NT + i_t).to(tl.int64) * K * V  # this chunk's state
    t0 = i_t * BT
    o_i = tl.arange(0, BT)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q = load_tile(q + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_h = load_tile(h + state, i_k * BK, i_v * BV, K, V, V, BK, BV).to(b_q.dtype)
        if GATE == 2:
            b_g = load_tile(gamma + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
            b_o += tl.dot((b_q * tl.exp2(b_g)).to(b_q.dtype), b_h, input_precision=DOT_PREC)
        else:
            b_o += tl.dot(b_q, b_h, input_precision=DOT_PREC)
        if not HAS_A:
            b_kt = load_tile_t(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
            b_A += tl.dot(b_q, b_kt, input_precision=DOT_PREC)
    m_causal = o_i[:, None] >= o_i[None, :]
    if GATE == 1:
        b_g = load_gamma_rows(gamma + seq, t0, T, H, BT)
        b_o *= tl.exp2(b_g)[:, None]
    if HAS_A:
        b_A = load_tile(A + seq * BT, t0, 0, T, BT, H * BT, BT, BT)
    elif GATE == 1:
        b_A *= tl.exp2(tl.where(m_causal, b_g[:, None] - b_g[None, :], float("-inf"))) * scale
    else:
        b_A = tl.where(m_causal, b_A, 0.0) * scale
    b_v = load_tile(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
    b_o = b_o * scale + tl.dot(b_A.to(b_v.dtype), b_v, input_precision=DOT_PREC)
    store_tile(o + seq * V, b_o, t0, i_v * BV, T, V, H * V, BT, BV)


@triton.jit
def chunk_bwd_dv_kernel(
    q, k, gamma, A, do, dh, dv, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, HAS_A: tl.constexpr, DOT_PREC: tl.constexpr,
):
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    state = (i_bh * NT + i_t).to(tl.int64) * K * V  # this chunk's state
    t0 = i_t * BT
    o_i = tl.arange(0, BT)
    last = tl.minimum(t0 + BT, T) - 1
    b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    b_At = tl.zeros([BT, BT], dtype=tl.float32)  # A transposed: [key j, query i]
    for i_k in range(tl.cdiv(K, BK)):
        b_k = load_tile(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_dh = load_tile(dh + state, i_k * BK, i_v * BV, K, V, V, BK, BV).to(b_k.dtype)
        if GATE == 2:
            b_g = load_tile(gamma + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
            b_glast = load_row(gamma + seq * K, last, i_k * BK, T, K, H * K, BK)
            b_kg = (b_k * tl.exp2(b_glast[None, :] - b_g)).to(b_k.dtype)
            b_dv += tl.dot(b_kg, b_dh, input_precision=DOT_PREC)
        else:
            b_dv += tl.dot(b_k, b_dh, input_precision=DOT_PREC)
        if not HAS_A:
            b_qt = load_tile_t(q + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
            b_At += tl.dot(b_k, b_qt, input_precision=DOT_PREC)
    m_causal_t = o_i[:, None] <= o_i[None, :]  # key j <= query i
    if GATE == 1:
        b_g = load_gamma_rows(gamma + seq, t0, T, H, BT)
        b_glast = tl.load(gamma + seq + last * H)
        b_dv *= tl.exp2(b_glast - b_g)[:, None]
    if HAS_A:
        b_At = load_tile_t(A + seq * BT, t0, 0, T, BT, H * BT, BT, BT)
    elif GATE == 1:
        b_At *= tl.exp2(tl.where(m_causal_t, b_g[None, :] - b_g[:, None], float("-inf"))) * scale
    else:
        b_At = tl.where(m_causal_t, b_At, 0.0) * scale
    b_do = load_tile(do + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
    b_dv += tl.dot(b_At.to(b_do.dtype), b_do, input_precision=DOT_PREC)
    store_tile(dv + seq * V, b_dv, t0, i_v * BV, T, V, H * V, BT, BV)


def chunk_fwd_output(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, h: torch.Tensor,
    gamma: torch.Tensor | None, gate: int, A: torch.Tensor | None, scale: float, chunk_size: int,
) -> torch.Tensor:
    """o: [B, T, H, V] in v's dtype.

    q, k: [B, T, H, K]; v: [B, T, H, V]; h: [B, H, NT, K, V] states entering each chunk;
    gamma: cumulative log2-gates ([B, T, H] or [B, T, H, K] fp32) or None; A: the
    intra-chunk matrix [B, T, H, BT] fp32 (required for a vector gate, else None).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    cfg = chunk_launch(gate).fwd_output
    BK, BV = block_size(K, cfg.BK), block_size(V, cfg.BV)
    o = new_buffer((B, T, H, V), v.dtype, v.device)
    grid = (triton.cdiv(V, BV), NT, B * H)
    chunk_fwd_output_kernel[grid](
        q, k, v, h, gamma if gamma is not None else q, A if A is not None else q, o, scale, T, NT,
        H=H, K=K, V=V, BT=chunk_size, BK=BK, BV=BV, GATE=gate, HAS_A=A is not None,
        DOT_PREC=dot_precision(q.dtype, cfg.fp32_dots), num_warps=warps(cfg.num_warps), num_stages=cfg.num_stages,
    )
    return o


def chunk_bwd_dv(
    q: torch.Tensor, k: torch.Tensor, do: torch.Tensor, dh: torch.Tensor,
    gamma: torch.Tensor | None, gate: int, A: torch.Tensor | None, scale: float, chunk_size: int,
) -> torch.Tensor:
    """dv: [B, T, H, V] in do's dtype; dh: [B, H, NT, K, V] gradients of the states leaving
    each chunk (chunk_bwd_states); other arguments as in chunk_fwd_output."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    cfg = chunk_launch(gate).bwd_dv
    BK, BV = block_size(K, cfg.BK), block_size(V, cfg.BV)
    dv = new_buffer((B, T, H, V), do.dtype, do.device)
    grid = (triton.cdiv(V, BV), NT, B * H)
    chunk_bwd_dv_kernel[grid](
        q, k, gamma if gamma is not None else q, A if A is not None else q, do, dh, dv, scale, T, NT,
        H=H, K=K, V=V, BT=chunk_size, BK=BK, BV=BV, GATE=gate, HAS_A=A is not None,
        DOT_PREC=dot_precision(q.dtype, cfg.fp32_dots), num_warps=warps(cfg.num_warps), num_stages=cfg.num_stages,
    )
    return dv
