"""Backward of the per-chunk WY/UT preparation (docs/design.md §10), and the final gradients.

Forward, per chunk: A = strictly-lower diag(beta) (K K^T ⊙ Gamma), Tm = (I + A)^{-1},
W = Tm diag(f) K with f = beta 2^gamma (gamma in log2 units), U0 = Tm diag(beta) V.
Given dW and dU0 (= dU), with gradients of gamma taken in natural-log units:
    dTm  = dW (diag(f) K)^T + dU (diag(beta) V)^T = (dW K^T diag(2^gamma) + dU V^T) diag(beta)
           (the kernel forms the second: products of the tiles as loaded, factors on the sums)
    dA   = -Tm^T dTm Tm^T, strictly lower part
    dk  += f ⊙ Tm^T dW  +  dM K  +  dM^T K,    dM = dA ⊙ beta_i Gamma_ij
    dv   = beta ⊙ Tm^T dU
    dbeta = 2^gamma ⊙ rowsum(K ⊙ Tm^T dW) + rowsum(V ⊙ Tm^T dU) + rowsum(dA ⊙ Gamma ⊙ K K^T)
    dgamma += f ⊙ rowsum(K ⊙ Tm^T dW) + rowsum(dA ⊙ A) - colsum(dA ⊙ A)
and dg = reverse cumsum of dgamma within the chunk (gamma_i = g_1 + ... + g_i).
dM^T is built from dA^T = -Tm dTm^T Tm, itself from loaded tiles (dTm^T = diag(f) K dW^T
+ diag(beta) V dU^T), so no product is ever transposed in registers (see
kernels/common/triton/solve.py); or, with WyBwdLaunch.dm_readback, dM is stored to a scratch
tile of its chunk and loaded back transposed (a CTA barrier between), which drops that second
pass. grid (chunks, heads). The passes are ordered so that at most two [BT, BT] fp32
accumulators are live at once (dTm with K K^T, then dTm^T).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.triton.gates import anticausal_decay, causal_decay
from kernels.common.triton.tiles import load_gamma_rows, load_tile, load_tile_t, load_vec, store_tile, store_vec
from kernels.common.triton.utils import block_size, chunk_and_head, chunk_grid, dot_precision, new_buffer, warps
from kernels.gated_delta_rule.triton_wy import delta_launch


@triton.jit(do_not_specialize=["T", "BTH", "NK"])
def wy_bwd_kernel(
    k, v, beta, gam, tm, dw, du, dk_part, dgam_part, dk, dv, dbeta, dg, dm_scratch, T, BTH, NK, H,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, NEED_DG: tl.constexpr, PREC: tl.constexpr, DM_READBACK: tl.constexpr,
    HEADS_FIRST: tl.constexpr,
):
    """dm_scratch: [B * H, cdiv(T, BT), BT, BT] in k's dtype with DM_READBACK (else unused)."""
    i_t, i_bh = chunk_and_head(0, HEADS_FIRST)
    wy_bwd_chunk(k, v, beta, gam, tm, dw, du, dk_part, dgam_part, dk, dv, dbeta, dg, dm_scratch, i_t, i_bh,
                 T, BTH, NK, H, K, V, BT, BK, BV, USE_G, NEED_DG, PREC, DM_READBACK)


@triton.jit
def wy_bwd_chunk(
    k, v, beta, gam, tm, dw, du, dk_part, dgam_part, dk, dv, dbeta, dg, dm_scratch, i_t, i_bh, T, BTH, NK, H,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, NEED_DG: tl.constexpr, PREC: tl.constexpr, DM_READBACK: tl.constexpr,
):
    """wy_bwd_kernel's work for chunk i_t of sequence of heads i_bh (also the second half of
    the fused backward, triton_bwd_fused.py)."""
    i_b, i_h = i_bh // H, i_bh % H
    seq = (i_b * T * H + i_h).to(tl.int64)
    t0 = i_t * BT
    dt = k.dtype.element_ty
    b_tmt = load_tile_t(tm + seq * BT, t0, 0, T, BT, H * BT, BT, BT)
    b_b = load_vec(beta + seq, t0, T, H, BT)
    b_g = tl.zeros([BT], dtype=tl.float32)
    b_eg = tl.full([BT], 1.0, dtype=tl.float32)
    if USE_G:
        b_g = load_gamma_rows(gam + seq, t0, T, H, BT)
        b_eg = tl.exp2(b_g)
    b_f = b_b * b_eg

    o_r = tl.arange(0, BT)
    # dTm and K K^T (K-blocks), then the V-blocks: dTm, dv and beta's share through U0
    b_dtm = tl.zeros([BT, BT], dtype=tl.float32)
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_k = load_tile(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_kt = load_tile_t(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_dw = load_tile(dw + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_kk += tl.dot(b_k, b_kt, input_precision=PREC)
        b_dtm += tl.dot(b_dw, b_kt, input_precision=PREC)
    # the factors of K's and V's rows scale dTm's columns: applied to the sums, not to the tiles
    if USE_G:
        b_dtm *= b_eg[None, :]
    b_db = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_v = load_tile(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        b_vt = load_tile_t(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        b_du = load_tile(du + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        b_dtm += tl.dot(b_du, b_vt, input_precision=PREC)
        b_dvb = tl.dot(b_tmt, b_du, input_precision=PREC)
        store_tile(dv + seq * V, b_dvb * b_b[:, None], t0, i_v * BV, T, V, H * V, BT, BV)
        b_db += tl.sum(b_dvb * b_v.to(tl.float32), axis=1)
    b_dtm *= b_b[None, :]
    b_da = -tl.dot(tl.dot(b_tmt, b_dtm.to(dt), input_precision=PREC).to(dt), b_tmt, input_precision=PREC)
    b_da = tl.where(o_r[:, None] > o_r[None, :], b_da, 0.0)
    b_gkk = causal_decay(b_kk, b_g, b_g, False, USE_G)  # Gamma ⊙ K K^T, strictly lower
    b_db += tl.sum(b_da * b_gkk, axis=1)
    b_dgam = tl.zeros([BT], dtype=tl.float32)
    if NEED_DG:
        b_daa = b_da * b_gkk * b_b[:, None]  # dA ⊙ A
        b_dgam = tl.sum(b_daa, axis=1) - tl.sum(b_daa, axis=0)
    b_dm = causal_decay(b_da * b_b[:, None], b_g, b_g, False, USE_G).to(dt)

    if DM_READBACK:  # dM^T as dM's own tile, stored and loaded back transposed
        p_dm = dm_scratch + (i_bh * tl.cdiv(T, BT) + i_t).to(tl.int64) * BT * BT
        store_tile(p_dm, b_dm, 0, 0, BT, BT, BT, BT, BT)
        tl.debug_barrier()  # every thread's part of the tile is written before any reads it
        b_dmt = load_tile_t(p_dm, 0, 0, BT, BT, BT, BT, BT)
    else:  # dTm^T from loaded tiles, then dA^T = -Tm dTm^T Tm and dM^T
        b_dtmt = tl.zeros([BT, BT], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            b_k = load_tile(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
            b_dwt = load_tile_t(dw + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
            b_dtmt += tl.dot(b_k, b_dwt, input_precision=PREC)
        if USE_G:
            b_dtmt *= b_eg[:, None]
        for i_v in range(tl.cdiv(V, BV)):
            b_v = load_tile(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
            b_dut = load_tile_t(du + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
            b_dtmt += tl.dot(b_v, b_dut, input_precision=PREC)
        b_dtmt *= b_b[:, None]
        b_tm = load_tile(tm + seq * BT, t0, 0, T, BT, H * BT, BT, BT)
        b_dat = -tl.dot(tl.dot(b_tm, b_dtmt.to(dt), input_precision=PREC).to(dt), b_tm, input_precision=PREC)
        b_dat = tl.where(o_r[None, :] > o_r[:, None], b_dat, 0.0)
        b_dmt = anticausal_decay(b_dat * b_b[None, :], b_g, b_g, False, USE_G).to(dt)

    for i_k in range(tl.cdiv(K, BK)):
        b_k = load_tile(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_dw = load_tile(dw + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_dkb = tl.dot(b_tmt, b_dw, input_precision=PREC)
        b_dk = load_tile(dk_part + seq * K, t0, i_k * BK, T, K, H * K, BT, BK).to(tl.float32)
        b_dk += b_dkb * b_f[:, None]
        b_dk += tl.dot(b_dm, b_k, input_precision=PREC)
        b_dk += tl.dot(b_dmt, b_k, input_precision=PREC)
        store_tile(dk + seq * K, b_dk, t0, i_k * BK, T, K, H * K, BT, BK)
        b_kdkb = tl.sum(b_dkb * b_k.to(tl.float32), axis=1)
        b_db += b_kdkb * b_eg
        b_dgam += b_kdkb * b_f
    store_vec(dbeta + seq, b_db, t0, T, H, BT)
    if NEED_DG:
        b_before = tl.zeros([BT], dtype=tl.float32)
        for i_p in range(NK):
            b_dgam += load_vec(dgam_part + i_p * BTH + seq, t0, T, H, BT)
            b_before += load_vec(dgam_part + (NK + i_p) * BTH + seq, t0, T, H, BT)
        # dg_l = sum_{i >= l} dgamma_i (summed from the chunk's end: the total less a running sum
        # would cancel where the gates are strong) + what the rows before l give (dqkw)
        b_dg = tl.cumsum(b_dgam, axis=0, reverse=True) + b_before
        store_vec(dg + seq, b_dg, t0, T, H, BT)


def wy_bwd_buffers(
    k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, dg_dtype: torch.dtype | None, chunk: int, dm_readback: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The WY backward's outputs (dk [B, T, H, K] k.dtype, dv [B, T, H, V] v.dtype, dbeta
    [B, T, H] beta.dtype, dg [B, T, H] in dg_dtype or None where dg_dtype is None) and its dM
    scratch: a [chunk, chunk] tile a chunk, [B * H, NT, chunk, chunk] in k's dtype, written
    and read by its own program only (k itself, unused, without dm_readback)."""
    B, T, H, K = k.shape
    dev = k.device
    dg = new_buffer((B, T, H), dg_dtype, dev) if dg_dtype is not None else None
    scratch = new_buffer((B * H, triton.cdiv(T, chunk), chunk, chunk), k.dtype, dev) if dm_readback else k
    return (new_buffer(k.shape, k.dtype, dev), new_buffer(v.shape, v.dtype, dev), new_buffer((B, T, H), beta.dtype, dev),
            dg, scratch)


def wy_bwd(
    k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, gam: torch.Tensor | None,
    tm: torch.Tensor, dw: torch.Tensor, du: torch.Tensor, dk_part: torch.Tensor,
    dgam_part: torch.Tensor | None, g_dtype: torch.dtype | None, need_dg: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H]; gam: [B, T, H] fp32 log2 units or
    None; tm: [B, T, H, BT] (wy_fwd's, BT the chunk length); dw, dk_part (fp32 or k's dtype):
    [B, T, H, K]; du: [B, T, H, V]; dgam_part: [2 NK, B, T, H] fp32 or None (dqkw's per-token
    d gamma, then its earlier-rows share of dg).
    Returns (dk [B, T, H, K] k.dtype, dv [B, T, H, V] v.dtype, dbeta [B, T, H] beta.dtype,
    dg [B, T, H] in g_dtype, or None without a gate or with need_dg False)."""
    B, T, H, K = k.shape
    BT = tm.shape[-1]
    V = v.shape[-1]
    launch = delta_launch(gam is not None)
    cfg = launch.wy_bwd
    BV = block_size(V, cfg.BV)
    need_dg = need_dg and gam is not None
    if need_dg and dgam_part is None:
        raise ValueError("wy_bwd: need_dg with a gate needs dqkw's dgam_part")
    dk, dv, dbeta, dg, dm_scratch = wy_bwd_buffers(k, v, beta, g_dtype if need_dg else None, BT, cfg.dm_readback)
    heads_first = launch.heads_first_at(triton.cdiv(T, BT))
    wy_bwd_kernel[chunk_grid((), triton.cdiv(T, BT), B * H, heads_first, "wy_bwd")](
        k, v, beta, gam if gam is not None else k, tm, dw, du, dk_part,
        dgam_part if dgam_part is not None else k, dk, dv, dbeta, dg if dg is not None else k, dm_scratch,
        T, B * T * H, dgam_part.shape[0] // 2 if dgam_part is not None else 0,
        H=H, K=K, V=V, BT=BT, BK=block_size(K, cfg.BK), BV=BV, USE_G=gam is not None,
        NEED_DG=need_dg, PREC=dot_precision(k.dtype, cfg.fp32_dots), DM_READBACK=cfg.dm_readback,
        HEADS_FIRST=heads_first,
        num_warps=warps(cfg.warps_for(BV)), num_stages=cfg.num_stages,
    )
    return dk, dv, dbeta, dg
