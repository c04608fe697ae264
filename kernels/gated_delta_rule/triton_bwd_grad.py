"""Per-chunk gradients of the (gated) delta rule through the output and the state update.

Chunk n (docs/design.md §10), q' = scale q, S = S_n entering, dS' = dS_{n+1} leaving, U and dU
from the forward / state_bwd:
    O  = diag(2^gamma) Q' S + P U,   P = Q' K^T ⊙ Gamma (lower, diagonal included)
    S' = 2^{gamma_C} S + Kd^T U,      Kd = K ⊙ 2^{gamma_C - gamma}
    U  = U0 - W S
give, with dP = dO U^T,
    dq' = diag(2^gamma) dO S^T + (dP ⊙ Gamma) K
    dk  = (dP ⊙ Gamma)^T Q' + diag(2^{gamma_C - gamma}) U dS'^T      (+ the WY part, later)
    dW  = -dU S^T
with gamma in log2 units (kernels/common/triton/gates.py), and the gradient of the
cumulative gate in natural-log units, gamma_i / LOG2E (its reverse cumsum is dg, in wy_bwd):
    q'_i . dq'_i - k_i . dk_i   (+ 2^{gamma_C} <S, dS'> + sum_j Kd_j-terms on the last row).
Formed so, dg is a difference of O(1) terms under strong gates (each row's own q'_i.k_i dP_ii
in both products, the last row's Kd-term in both sums) and fp32 leaves it an error of
eps32 e^|g|. So the kernel writes what does not cancel: with Pp = (dP ⊙ Gamma) ⊙ Q'K^T
strictly below the diagonal, d gamma_i = q'_i . dq'_i(state) + rowsum(Pp)_i - colsum(Pp)_i,
and apart from it the share of dg that rows before l give, 2^{gamma_C} <S, dS'> +
sum_{j < l} k_j . dk_j(state), which wy_bwd adds after its reverse cumsum.
(dP ⊙ Gamma)^T is computed as (U dO^T ⊙ Gamma^T), from loaded tiles, rather than by
transposing a product (kernels/common/triton/solve.py says why).

grid (K-blocks, chunks, heads); each program loops twice over the V-blocks, once for dP and
once for the state products (first when gated, so that the gate's row factors scale their sums
once), so at most four [BT, BK] or [BT, BT] accumulators are live at once. With
DqkwLaunch.k_loop, where K spans several K-blocks, dqkw_k_loop_kernel runs instead: grid
(chunks, heads), each program forms dP ⊙ Gamma and its transpose once and walks the K-blocks,
so no chunk's dP is formed (nor its dO and U tiles loaded for it) once per K-block; its d gamma
shares are summed over the K-blocks in registers (dgam_part then has one row each). Outputs: dq (final,
q's dtype), dk_part (fp32 or 16-bit, completed by wy_bwd), dW (input dtype), dgam_part
[NK, B, T, H] fp32 (one partial per K-block, summed by wy_bwd), written only where the gate
wants a gradient (NEED_DG; the linearized softmax GDN's gates come from positions).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.triton.gates import anticausal_decay, causal_decay, pair_gate_grad, sum_before
from kernels.common.triton.tiles import load_gamma_rows, load_tile, load_tile_t, store_tile, store_vec
from kernels.common.triton.utils import block_size, chunk_and_head, chunk_grid, dot_precision, new_buffer, warps
from kernels.gated_delta_rule.triton_wy import CHUNK, delta_launch


@triton.jit
def _chunk_gates(gam, seq, t0, T, H, BT: tl.constexpr, USE_G: tl.constexpr):
    """A chunk's cumulative log2-gates [BT] and its last row's (0 without a gate)."""
    b_g = tl.zeros([BT], dtype=tl.float32)
    b_glast = tl.zeros([], dtype=tl.float32)
    if USE_G:
        last = tl.minimum(t0 + BT, T) - 1
        b_glast = tl.load(gam + seq + last * H)
        b_g = load_gamma_rows(gam + seq, t0, T, H, BT)
    return b_g, b_glast


@triton.jit
def _intra_dp(do, u, seq, t0, T, H, b_g,
              V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr, PREC: tl.constexpr):
    """dP ⊙ Gamma (lower, diagonal included) and (dP ⊙ Gamma)^T, fp32 [BT, BT], from
    dP = dO U^T and its transpose, each from loaded tiles (one loop over V)."""
    b_dp = tl.zeros([BT, BT], dtype=tl.float32)
    b_dpt = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        v0 = i_v * BV
        b_do = load_tile(do + seq * V, t0, v0, T, V, H * V, BT, BV)
        b_u = load_tile(u + seq * V, t0, v0, T, V, H * V, BT, BV)
        b_dot = load_tile_t(do + seq * V, t0, v0, T, V, H * V, BT, BV)
        b_ut = load_tile_t(u + seq * V, t0, v0, T, V, H * V, BT, BV)
        b_dp += tl.dot(b_do, b_ut, input_precision=PREC)
        b_dpt += tl.dot(b_u, b_dot, input_precision=PREC)
    return causal_decay(b_dp, b_g, b_g, True, USE_G), anticausal_decay(b_dpt, b_g, b_g, True, USE_G)


@triton.jit
def _intra_chunk(do, u, seq, t0, T, H, b_q, b_k, b_g, scale,
                 V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr, PREC: tl.constexpr):
    """The intra-chunk parts of dq' and dk from dP = dO U^T and its transpose (_intra_dp):
    (dq' part, dk part, dP ⊙ Gamma)."""
    dt = b_k.dtype
    b_dpg, b_dptg = _intra_dp(do, u, seq, t0, T, H, b_g, V, BT, BV, USE_G, PREC)
    b_dq = tl.dot(b_dpg.to(dt), b_k, input_precision=PREC)
    b_dk = tl.dot(b_dptg.to(dt), b_q, input_precision=PREC) * scale
    return b_dq, b_dk, b_dpg


@triton.jit
def _state_products(do, u, du, p_h, p_dh, seq, t0, k0, T, H, b_dq, b_dk,
                    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                    NEED_DG: tl.constexpr, PREC: tl.constexpr):
    """The state products of one K-block, summed over V onto b_dq and b_dk: dO S^T, U dS'^T,
    and dU S^T (dW's negative), with <S, dS'>'s column sums where the gate wants a gradient:
    (b_dq, b_dk, dU S^T, column sums [BK])."""
    b_dw = tl.zeros([BT, BK], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        v0 = i_v * BV
        b_do = load_tile(do + seq * V, t0, v0, T, V, H * V, BT, BV)
        b_u = load_tile(u + seq * V, t0, v0, T, V, H * V, BT, BV)
        b_du = load_tile(du + seq * V, t0, v0, T, V, H * V, BT, BV)
        b_ht = load_tile_t(p_h, k0, v0, K, V, V, BK, BV)
        b_dht = load_tile_t(p_dh, k0, v0, K, V, V, BK, BV)
        b_dq += tl.dot(b_do, b_ht, input_precision=PREC)
        b_dk += tl.dot(b_u, b_dht, input_precision=PREC)
        b_dw += tl.dot(b_du, b_ht, input_precision=PREC)
        if NEED_DG:
            b_hdh += tl.sum(b_ht.to(tl.float32) * b_dht.to(tl.float32), axis=0)
    return b_dq, b_dk, b_dw, b_hdh


@triton.jit
def _state_block(do, u, du, dw, p_h, p_dh, seq, t0, k0, T, H, b_dq, b_dk, b_g, b_glast,
                 K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 USE_G: tl.constexpr, NEED_DG: tl.constexpr, PREC: tl.constexpr):
    """One K-block's state products (_state_products) onto b_dq and b_dk, dW stored, and, when
    gated, the gate's row factors on the sums (b_dq and b_dk then start from zero, the
    intra-chunk parts joining after): (b_dq, b_dk, <S, dS'>'s column sums [BK])."""
    b_dq, b_dk, b_dw, b_hdh = _state_products(do, u, du, p_h, p_dh, seq, t0, k0, T, H, b_dq, b_dk,
                                              K, V, BT, BK, BV, NEED_DG, PREC)
    store_tile(dw + seq * K, -b_dw, t0, k0, T, K, H * K, BT, BK)
    if USE_G:
        b_dq *= tl.exp2(b_g)[:, None]
        b_dk *= tl.exp2(b_glast - b_g)[:, None]
    return b_dq, b_dk, b_hdh


@triton.jit(do_not_specialize=["T", "NT", "BTH"])
def dqkw_kernel(
    q, k, u, h, dh, do, du, gam, dq, dk, dw, dgam, scale, T, NT, BTH, H,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, NEED_DG: tl.constexpr, PREC: tl.constexpr, HEADS_FIRST: tl.constexpr,
):
    i_k = tl.program_id(0)
    i_t, i_bh = chunk_and_head(1, HEADS_FIRST)
    i_b, i_h = i_bh // H, i_bh % H
    seq = (i_b * T * H + i_h).to(tl.int64)
    t0, k0 = i_t * BT, i_k * BK
    p_h = h + (i_bh * NT + i_t).to(tl.int64) * K * V
    p_dh = dh + (i_bh * NT + i_t).to(tl.int64) * K * V
    b_g, b_glast = _chunk_gates(gam, seq, t0, T, H, BT, USE_G)
    b_q = load_tile(q + seq * K, t0, k0, T, K, H * K, BT, BK)
    b_k = load_tile(k + seq * K, t0, k0, T, K, H * K, BT, BK)
    # Ungated, the intra-chunk parts come first and the state products add to them. Gated,
    # the state products come first: the gate's row factors then scale their sums over V once,
    # after their loop, rather than the rows of every dO and U tile before it.
    if USE_G:
        b_dq = tl.zeros([BT, BK], dtype=tl.float32)
        b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    else:
        b_dq, b_dk, b_dpg = _intra_chunk(do, u, seq, t0, T, H, b_q, b_k, b_g, scale, V, BT, BV, USE_G, PREC)
    b_dq, b_dk, b_hdh = _state_block(do, u, du, dw, p_h, p_dh, seq, t0, k0, T, H, b_dq, b_dk, b_g, b_glast,
                                     K, V, BT, BK, BV, USE_G, NEED_DG, PREC)
    if USE_G:
        b_qdqs = tl.zeros([BT], dtype=tl.float32)
        b_kdks = tl.zeros([BT], dtype=tl.float32)
        if NEED_DG:  # the state parts' shares of d gamma, before the intra-chunk parts join them
            b_qdqs = tl.sum(b_q.to(tl.float32) * b_dq, axis=1)
            b_kdks = tl.sum(b_k.to(tl.float32) * b_dk, axis=1)
        b_dq_intra, b_dk_intra, b_dpg = _intra_chunk(do, u, seq, t0, T, H, b_q, b_k, b_g, scale, V, BT, BV,
                                                     USE_G, PREC)
        b_dq += b_dq_intra
        b_dk += b_dk_intra
        if NEED_DG:
            # d gamma_i = q'_i . dq'_i - k_i . dk_i plus the terms of gamma_C, summed without
            # what cancels (module docstring): the intra-chunk products below the diagonal,
            # the state part of q'.dq', and, as its own share of dg, the k.dk state terms of
            # earlier rows
            b_pp = b_dpg * tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * scale
            b_dgam = b_qdqs * scale + pair_gate_grad(b_pp)
            b_before = tl.exp2(b_glast) * tl.sum(b_hdh, axis=0) + sum_before(b_kdks)
            store_vec(dgam + i_k.to(tl.int64) * BTH + seq, b_dgam, t0, T, H, BT)
            store_vec(dgam + (tl.num_programs(0) + i_k).to(tl.int64) * BTH + seq, b_before, t0, T, H, BT)
    # b_dq is the gradient with respect to q' = scale q
    store_tile(dq + seq * K, b_dq * scale, t0, k0, T, K, H * K, BT, BK)
    store_tile(dk + seq * K, b_dk, t0, k0, T, K, H * K, BT, BK)


@triton.jit(do_not_specialize=["T", "NT", "BTH"])
def dqkw_k_loop_kernel(
    q, k, u, h, dh, do, du, gam, dq, dk, dw, dgam, scale, T, NT, BTH, H,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, NEED_DG: tl.constexpr, PREC: tl.constexpr, HEADS_FIRST: tl.constexpr,
):
    """dqkw_kernel's outputs with one program a chunk walking the K-blocks (DqkwLaunch.k_loop):
    dP ⊙ Gamma and its transpose are formed once, before the loop, and dgam holds one row of
    d gamma and one of the earlier rows' share, each summed over the K-blocks (the pair terms
    over the whole K at once)."""
    i_t, i_bh = chunk_and_head(0, HEADS_FIRST)
    dqkw_chunk(q, k, u, h, dh, do, du, gam, dq, dk, dw, dgam, scale, i_t, i_bh, T, NT, BTH, H,
               K, V, BT, BK, BV, USE_G, NEED_DG, PREC)


@triton.jit
def dqkw_chunk(
    q, k, u, h, dh, do, du, gam, dq, dk, dw, dgam, scale, i_t, i_bh, T, NT, BTH, H,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, NEED_DG: tl.constexpr, PREC: tl.constexpr,
):
    """dqkw_k_loop_kernel's work for chunk i_t of sequence of heads i_bh (also the first half
    of the fused backward, triton_bwd_fused.py)."""
    i_b, i_h = i_bh // H, i_bh % H
    seq = (i_b * T * H + i_h).to(tl.int64)
    t0 = i_t * BT
    dt = q.dtype.element_ty
    p_h = h + (i_bh * NT + i_t).to(tl.int64) * K * V
    p_dh = dh + (i_bh * NT + i_t).to(tl.int64) * K * V
    b_g, b_glast = _chunk_gates(gam, seq, t0, T, H, BT, USE_G)
    b_dpg, b_dptg = _intra_dp(do, u, seq, t0, T, H, b_g, V, BT, BV, USE_G, PREC)
    b_dptg = b_dptg.to(dt)
    b_dgam = tl.zeros([BT], dtype=tl.float32)
    if NEED_DG:
        # the gate's pair terms take dP ⊙ Gamma in fp32 against Q'K^T over the whole K, formed
        # here so that only its 16-bit copy stays live through the K-blocks below
        b_qk = tl.zeros([BT, BT], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            b_q = load_tile(q + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
            b_k = load_tile(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
            b_qk += tl.dot(b_q, tl.trans(b_k), input_precision=PREC)
        b_dgam = pair_gate_grad(b_dpg * b_qk * scale)
    b_dpg = b_dpg.to(dt)
    b_kdks = tl.zeros([BT], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        k0 = i_k * BK
        b_q = load_tile(q + seq * K, t0, k0, T, K, H * K, BT, BK)
        b_k = load_tile(k + seq * K, t0, k0, T, K, H * K, BT, BK)
        b_dq = tl.zeros([BT, BK], dtype=tl.float32)
        b_dk = tl.zeros([BT, BK], dtype=tl.float32)
        b_dq, b_dk, b_hdh_k = _state_block(do, u, du, dw, p_h, p_dh, seq, t0, k0, T, H, b_dq, b_dk, b_g, b_glast,
                                           K, V, BT, BK, BV, USE_G, NEED_DG, PREC)
        if NEED_DG:  # this K-block's state shares of d gamma (dqkw_kernel says which)
            b_dgam += tl.sum(b_q.to(tl.float32) * b_dq, axis=1) * scale
            b_kdks += tl.sum(b_k.to(tl.float32) * b_dk, axis=1)
            b_hdh += b_hdh_k
        b_dq += tl.dot(b_dpg, b_k, input_precision=PREC)
        b_dk += tl.dot(b_dptg, b_q, input_precision=PREC) * scale
        store_tile(dq + seq * K, b_dq * scale, t0, k0, T, K, H * K, BT, BK)
        store_tile(dk + seq * K, b_dk, t0, k0, T, K, H * K, BT, BK)
    if NEED_DG:
        store_vec(dgam + seq, b_dgam, t0, T, H, BT)
        store_vec(dgam + BTH + seq, tl.exp2(b_glast) * tl.sum(b_hdh, axis=0) + sum_before(b_kdks), t0, T, H, BT)


def dqkw_buffers(
    q: torch.Tensor, k: torch.Tensor, dk_part_16bit: bool, dgam_blocks: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """dqkw's outputs: dq [B, T, H, K] q.dtype, dk's share (k.dtype for 16-bit inputs under
    dk_part_16bit, else fp32), dW k.dtype, and dgam_part [2 dgam_blocks, B, T, H] fp32 (None
    for 0 blocks: no d gamma wanted)."""
    B, T, H, K = q.shape
    dev = q.device
    dk_dtype = k.dtype if dk_part_16bit and k.element_size() == 2 else torch.float32
    dgam = new_buffer((2 * dgam_blocks, B, T, H), torch.float32, dev) if dgam_blocks else None
    return new_buffer(q.shape, q.dtype, dev), new_buffer(k.shape, dk_dtype, dev), new_buffer(k.shape, k.dtype, dev), dgam


def dqkw(
    q: torch.Tensor, k: torch.Tensor, u: torch.Tensor, h: torch.Tensor, dh: torch.Tensor,
    do: torch.Tensor, du: torch.Tensor, gam: torch.Tensor | None, scale: float, chunk_size: int = CHUNK,
    need_dg: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """q, k: [B, T, H, K]; u, do, du: [B, T, H, V]; h, dh: [B, H, NT, K, V]; gam: [B, T, H] fp32 or None.
    Returns (dq [B, T, H, K] q.dtype, dk_part fp32 (k.dtype for 16-bit inputs under
    DqkwLaunch.dk_part_16bit), dW k.dtype, dgam_part [2 NK, B, T, H] fp32 ([2, B, T, H] under
    DqkwLaunch.k_loop), or None without a gate or with need_dg False: per K-block the d gamma
    of each token, then the share of dg that earlier rows of the chunk give)."""
    B, T, H, K = q.shape
    V = u.shape[-1]
    BT = chunk_size
    NT = triton.cdiv(T, BT)
    launch = delta_launch(gam is not None)
    cfg = launch.dqkw
    BK = block_size(K, cfg.BK)
    NK = triton.cdiv(K, BK)
    k_loop = cfg.k_loop and NK > 1
    # rows [0, NK): each K-block's d gamma per token; [NK, 2 NK): its share of dg from earlier
    # rows; the k-loop kernel sums the K-blocks' shares itself (one row each)
    need_dg = need_dg and gam is not None
    dq, dk, dw, dgam = dqkw_buffers(q, k, cfg.dk_part_16bit, (1 if k_loop else NK) if need_dg else 0)
    heads_first = launch.heads_first_at(NT)
    kernel, lead = (dqkw_k_loop_kernel, ()) if k_loop else (dqkw_kernel, (NK,))
    kernel[chunk_grid(lead, NT, B * H, heads_first, "dqkw")](
        q, k, u, h, dh, do, du, gam if gam is not None else q, dq, dk, dw,
        dgam if dgam is not None else q, scale, T, NT, B * T * H,
        H=H, K=K, V=V, BT=BT, BK=BK, BV=block_size(V, cfg.block_v_for(K)), USE_G=gam is not None,
        NEED_DG=need_dg, PREC=dot_precision(q.dtype, cfg.fp32_dots), HEADS_FIRST=heads_first,
        num_warps=warps(cfg.num_warps), num_stages=cfg.num_stages,
    )
    return dq, dk, dw, dgam
