"""Per-chunk WY/UT preparation of the (gated) delta rule, forward (docs/design.md §10), chunk BT = 64.

For each chunk, in parallel (grid: chunks x heads):
    gamma = cumsum(LOG2E g) within the chunk (log2 units; stored, fp32; the other kernels
            read it), each term first raised to the gate floor (kernels/common/triton/gates.py:
            g = -inf, a full reset, stays a finite sum, and exp2(gamma_i - gamma_j) never
            meets -inf - (-inf))
    A     = strictly lower part of diag(beta) (K K^T ⊙ Gamma),  Gamma_ij = 2^{gamma_i - gamma_j}
    Tm    = (I + A)^{-1}                       (kernels/common/triton/solve.py)
    W     = Tm diag(beta 2^gamma) K,   U0 = Tm diag(beta) V

The chunk length BT is a constexpr, but this kernel's solve is written for BT = 64 (a
static assertion says so): the chunk is handled as four 16-row sub-blocks: A and Tm live in registers as ten 16 x 16
blocks, so no 64 x 64 tile is ever sliced or sent through memory before W and U0 are made.
Tm, W and U0 are stored in the input dtype (the dtype of the products that read them).
USE_G=False is the ungated delta rule (g is not read, gamma not written).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.launch import DeltaLaunch, settings
from kernels.common.triton.gates import causal_decay, log2_gates
from kernels.common.triton.solve import unit_lower_inverse_64
from kernels.common.triton.tiles import chunk_gram, load_tile, load_vec, store_tile, store_vec
from kernels.common.triton.utils import block_size, chunk_and_head, chunk_grid, dot_precision, new_buffer, warps

CHUNK = 64  # tokens per chunk: the blockwise solve below (kernels/common/triton/solve.py) is written for 64


def delta_op(gated: bool) -> str:
    """The op whose launch settings the delta-rule kernels run under: gated_delta_rule with
    a gate, delta_rule without."""
    return "gated_delta_rule" if gated else "delta_rule"


def delta_launch(gated: bool) -> DeltaLaunch:
    """The delta-rule kernels' launch settings in effect (kernels/common/launch/)."""
    return settings(delta_op(gated))


def solve_precision(dtype: torch.dtype, tf32_solve: bool, fp32_dots: str = "ieee") -> str:
    """Dot precision of the chunk inverse (I + A)^{-1}: fp32_dots ("ieee", true fp32, or
    "tf32x3"; KernelLaunch.fp32_dots) unless the inputs are 16-bit and tf32_solve is set (the
    inverse is then rounded to 16 bits anyway)."""
    if dtype != torch.float32 and tf32_solve:
        return "tf32"
    return fp32_dots


@triton.jit
def _kkt_block(b_kk, b_bi, b_gi, b_gj, DIAG: tl.constexpr, USE_G: tl.constexpr):
    """A block from its k_i . k_j block: beta_i 2^(gamma_i - gamma_j) (k_i . k_j), strictly
    lower on the diagonal blocks."""
    b_a = b_kk * b_bi[:, None]
    if DIAG:
        return causal_decay(b_a, b_gi, b_gj, False, USE_G)
    if USE_G:
        return b_a * tl.exp2(b_gi[:, None] - b_gj[None, :])
    return b_a


@triton.jit(do_not_specialize=["T"])
def wy_fwd_kernel(
    k, v, beta, g, gam, tm, w, u0, q, pm, scale, T, H,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, PREC: tl.constexpr, SOLVE_PREC: tl.constexpr, STORE_TM: tl.constexpr,
    HEADS_FIRST: tl.constexpr, STORE_P: tl.constexpr,
):
    i_t, i_bh = chunk_and_head(0, HEADS_FIRST)
    i_b, i_h = i_bh // H, i_bh % H
    tl.static_assert(BT == 64, "wy_fwd's blockwise solve is written for 64-token chunks")
    seq = (i_b * T * H + i_h).to(tl.int64)
    t0 = i_t * BT
    # per-token scalars of the four 16-row sub-blocks
    b_b0 = load_vec(beta + seq, t0, T, H, 16)
    b_b1 = load_vec(beta + seq, t0 + 16, T, H, 16)
    b_b2 = load_vec(beta + seq, t0 + 32, T, H, 16)
    b_b3 = load_vec(beta + seq, t0 + 48, T, H, 16)
    b_g0 = tl.zeros([16], dtype=tl.float32)
    b_g1 = tl.zeros([16], dtype=tl.float32)
    b_g2 = tl.zeros([16], dtype=tl.float32)
    b_g3 = tl.zeros([16], dtype=tl.float32)
    if USE_G:
        # zero-padded g past T keeps gamma flat there: padded rows decay nothing
        # summed in fp64 and rounded once (kernels/common/triton/cumsum.py says why)
        b_r0 = log2_gates(load_vec(g + seq, t0, T, H, 16)).to(tl.float64)
        b_r1 = log2_gates(load_vec(g + seq, t0 + 16, T, H, 16)).to(tl.float64)
        b_r2 = log2_gates(load_vec(g + seq, t0 + 32, T, H, 16)).to(tl.float64)
        b_r3 = log2_gates(load_vec(g + seq, t0 + 48, T, H, 16)).to(tl.float64)
        b_s0 = tl.sum(b_r0, axis=0)
        b_s1 = b_s0 + tl.sum(b_r1, axis=0)
        b_s2 = b_s1 + tl.sum(b_r2, axis=0)
        b_g0 = tl.cumsum(b_r0, axis=0).to(tl.float32)
        b_g1 = (tl.cumsum(b_r1, axis=0) + b_s0).to(tl.float32)
        b_g2 = (tl.cumsum(b_r2, axis=0) + b_s1).to(tl.float32)
        b_g3 = (tl.cumsum(b_r3, axis=0) + b_s2).to(tl.float32)
        store_vec(gam + seq, b_g0, t0, T, H, 16)
        store_vec(gam + seq, b_g1, t0 + 16, T, H, 16)
        store_vec(gam + seq, b_g2, t0 + 32, T, H, 16)
        store_vec(gam + seq, b_g3, t0 + 48, T, H, 16)

    # A = K K^T by 16 x 16 blocks, summed over K in BK-wide slices
    a00 = tl.zeros([16, 16], dtype=tl.float32)
    a10 = tl.zeros([16, 16], dtype=tl.float32)
    a11 = tl.zeros([16, 16], dtype=tl.float32)
    a20 = tl.zeros([16, 16], dtype=tl.float32)
    a21 = tl.zeros([16, 16], dtype=tl.float32)
    a22 = tl.zeros([16, 16], dtype=tl.float32)
    a30 = tl.zeros([16, 16], dtype=tl.float32)
    a31 = tl.zeros([16, 16], dtype=tl.float32)
    a32 = tl.zeros([16, 16], dtype=tl.float32)
    a33 = tl.zeros([16, 16], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_k0, b_k1, b_k2, b_k3 = _chunk_rows(k, seq, i_t, i_k * BK, T, H, K, BK)
        a00 += tl.dot(b_k0, tl.trans(b_k0), input_precision=PREC)
        a10 += tl.dot(b_k1, tl.trans(b_k0), input_precision=PREC)
        a11 += tl.dot(b_k1, tl.trans(b_k1), input_precision=PREC)
        a20 += tl.dot(b_k2, tl.trans(b_k0), input_precision=PREC)
        a21 += tl.dot(b_k2, tl.trans(b_k1), input_precision=PREC)
        a22 += tl.dot(b_k2, tl.trans(b_k2), input_precision=PREC)
        a30 += tl.dot(b_k3, tl.trans(b_k0), input_precision=PREC)
        a31 += tl.dot(b_k3, tl.trans(b_k1), input_precision=PREC)
        a32 += tl.dot(b_k3, tl.trans(b_k2), input_precision=PREC)
        a33 += tl.dot(b_k3, tl.trans(b_k3), input_precision=PREC)
    a00 = _kkt_block(a00, b_b0, b_g0, b_g0, True, USE_G)
    a10 = _kkt_block(a10, b_b1, b_g1, b_g0, False, USE_G)
    a11 = _kkt_block(a11, b_b1, b_g1, b_g1, True, USE_G)
    a20 = _kkt_block(a20, b_b2, b_g2, b_g0, False, USE_G)
    a21 = _kkt_block(a21, b_b2, b_g2, b_g1, False, USE_G)
    a22 = _kkt_block(a22, b_b2, b_g2, b_g2, True, USE_G)
    a30 = _kkt_block(a30, b_b3, b_g3, b_g0, False, USE_G)
    a31 = _kkt_block(a31, b_b3, b_g3, b_g1, False, USE_G)
    a32 = _kkt_block(a32, b_b3, b_g3, b_g2, False, USE_G)
    a33 = _kkt_block(a33, b_b3, b_g3, b_g3, True, USE_G)
    t00, t10, t11, t20, t21, t22, t30, t31, t32, t33 = unit_lower_inverse_64(
        a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, SOLVE_PREC)

    # Tm, zero blocks above the diagonal included (the backward reads whole BT x BT tiles);
    # a forward without a backward stores none
    if STORE_TM:
        p_tm = tm + seq * BT
        zero = tl.zeros([16, 16], dtype=tl.float32)
        _store_row_of_blocks(p_tm, t00, zero, zero, zero, t0, T, H * BT)
        _store_row_of_blocks(p_tm, t10, t11, zero, zero, t0 + 16, T, H * BT)
        _store_row_of_blocks(p_tm, t20, t21, t22, zero, t0 + 32, T, H * BT)
        _store_row_of_blocks(p_tm, t30, t31, t32, t33, t0 + 48, T, H * BT)

    # W = Tm diag(beta e^gamma) K and U0 = Tm diag(beta) V, 16 rows at a time
    dt = k.dtype.element_ty
    c00, c10, c11 = t00.to(dt), t10.to(dt), t11.to(dt)
    c20, c21, c22 = t20.to(dt), t21.to(dt), t22.to(dt)
    c30, c31, c32, c33 = t30.to(dt), t31.to(dt), t32.to(dt), t33.to(dt)
    f0, f1, f2, f3 = b_b0, b_b1, b_b2, b_b3
    if USE_G:
        f0, f1, f2, f3 = b_b0 * tl.exp2(b_g0), b_b1 * tl.exp2(b_g1), b_b2 * tl.exp2(b_g2), b_b3 * tl.exp2(b_g3)
    for i_k in range(tl.cdiv(K, BK)):
        b_k0, b_k1, b_k2, b_k3 = _chunk_rows(k, seq, i_t, i_k * BK, T, H, K, BK)
        x0, x1 = (b_k0 * f0[:, None]).to(dt), (b_k1 * f1[:, None]).to(dt)
        x2, x3 = (b_k2 * f2[:, None]).to(dt), (b_k3 * f3[:, None]).to(dt)
        _tri_apply(w + seq * K, x0, x1, x2, x3, c00, c10, c11, c20, c21, c22, c30, c31, c32, c33,
                   t0, T, H * K, i_k * BK, K, BK, PREC)
    for i_v in range(tl.cdiv(V, BV)):
        b_v0, b_v1, b_v2, b_v3 = _chunk_rows(v, seq, i_t, i_v * BV, T, H, V, BV)
        x0, x1 = (b_v0 * b_b0[:, None]).to(dt), (b_v1 * b_b1[:, None]).to(dt)
        x2, x3 = (b_v2 * b_b2[:, None]).to(dt), (b_v3 * b_b3[:, None]).to(dt)
        _tri_apply(u0 + seq * V, x0, x1, x2, x3, c00, c10, c11, c20, c21, c22, c30, c31, c32, c33,
                   t0, T, H * V, i_v * BV, V, BV, PREC)
    if STORE_P:  # the output's P, after the solve's blocks are dead
        _store_output_p(q, k, g, pm, scale, seq, t0, T, H, K, BT, BK, USE_G, PREC)


@triton.jit
def _store_output_p(q, k, g, pm, scale, seq, t0, T, H, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                    USE_G: tl.constexpr, PREC: tl.constexpr):
    """Chunk rows t0 .. t0 + BT - 1 of P = scale (Q K^T ⊙ 2^(gamma_i - gamma_j)), lower with the
    diagonal, rounded to q's dtype as the output's product reads it, into pm ([B, T, H, BT]).
    gamma is summed again over the whole chunk, in fp64 as above, so it may differ from the
    stored one in its last fp32 bit."""
    b_p = chunk_gram(q, k, seq, t0, T, H, K, BT, BK, PREC)
    b_g = tl.zeros([BT], dtype=tl.float32)
    if USE_G:
        b_g = tl.cumsum(log2_gates(load_vec(g + seq, t0, T, H, BT)).to(tl.float64), axis=0).to(tl.float32)
    b_p = causal_decay(b_p * scale, b_g, b_g, True, USE_G)
    store_tile(pm + seq * BT, b_p.to(q.dtype.element_ty), t0, 0, T, BT, H * BT, BT, BT)


@triton.jit
def _chunk_rows(x, seq, i_t, col0, T, H, D: tl.constexpr, BC: tl.constexpr):
    """Chunk i_t's rows of one head of x [B, T, H, D], columns col0 .. col0 + BC - 1, as four
    [16, BC] blocks in x's dtype."""
    p, t0 = x + seq * D, i_t * 64
    b_0 = load_tile(p, t0, col0, T, D, H * D, 16, BC)
    b_1 = load_tile(p, t0 + 16, col0, T, D, H * D, 16, BC)
    b_2 = load_tile(p, t0 + 32, col0, T, D, H * D, 16, BC)
    b_3 = load_tile(p, t0 + 48, col0, T, D, H * D, 16, BC)
    return b_0, b_1, b_2, b_3


@triton.jit
def _store_row_of_blocks(p, x0, x1, x2, x3, row0, T, stride):
    """Rows row0 .. row0 + 15 of a [T, 64] tile (row stride `stride`) from four 16 x 16 blocks."""
    store_tile(p, x0, row0, 0, T, 64, stride, 16, 16)
    store_tile(p, x1, row0, 16, T, 64, stride, 16, 16)
    store_tile(p, x2, row0, 32, T, 64, stride, 16, 16)
    store_tile(p, x3, row0, 48, T, 64, stride, 16, 16)


@triton.jit
def _tri_apply(out, x0, x1, x2, x3, c00, c10, c11, c20, c21, c22, c30, c31, c32, c33,
               t0, T, stride, col0, n_cols, BC: tl.constexpr, PREC: tl.constexpr):
    """out rows t0..t0+63 = Tm @ X, with Tm given by its lower 16 x 16 blocks."""
    y0 = tl.dot(c00, x0, input_precision=PREC)
    y1 = tl.dot(c10, x0, input_precision=PREC) + tl.dot(c11, x1, input_precision=PREC)
    y2 = (tl.dot(c20, x0, input_precision=PREC) + tl.dot(c21, x1, input_precision=PREC)
          + tl.dot(c22, x2, input_precision=PREC))
    y3 = (tl.dot(c30, x0, input_precision=PREC) + tl.dot(c31, x1, input_precision=PREC)
          + tl.dot(c32, x2, input_precision=PREC) + tl.dot(c33, x3, input_precision=PREC))
    store_tile(out, y0, t0, col0, T, n_cols, stride, 16, BC)
    store_tile(out, y1, t0 + 16, col0, T, n_cols, stride, 16, BC)
    store_tile(out, y2, t0 + 32, col0, T, n_cols, stride, 16, BC)
    store_tile(out, y3, t0 + 48, col0, T, n_cols, stride, 16, BC)


def wy_fwd(
    k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor | None, store_tm: bool = True,
    q: torch.Tensor | None = None, scale: float = 1.0, p: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """k: [B, T, H, K], v: [B, T, H, V], beta, g: [B, T, H] (g None: ungated), contiguous.

    Returns (gamma [B, T, H] fp32 cumulative log2-gates or None, Tm [B, T, H, 64] or None
    unless store_tm, W [B, T, H, K], U0 [B, T, H, V]), Tm, W, U0 in k's dtype; row t of Tm
    holds row (t mod 64) of its chunk's inverse (only the backward reads it). With q
    ([B, T, H, K]) and p ([B, T, H, 64] in q's dtype) each chunk's P = scale (Q K^T ⊙ Gamma)
    is written into p too (DeltaLaunch.p_in_wy), row t holding row (t mod 64) of its chunk's."""
    if (q is None) != (p is None):
        raise ValueError("wy_fwd: q and p come together (P formed here needs q, and a buffer to go to)")
    B, T, H, K = k.shape
    V = v.shape[-1]
    dev, dt = k.device, k.dtype
    gam = new_buffer((B, T, H), torch.float32, dev) if g is not None else None
    tm = new_buffer((B, T, H, CHUNK), dt, dev) if store_tm else None
    w = new_buffer((B, T, H, K), dt, dev)
    u0 = new_buffer((B, T, H, V), dt, dev)
    launch = delta_launch(g is not None)
    cfg = launch.wy_fwd
    heads_first = launch.heads_first_at(triton.cdiv(T, CHUNK))
    wy_fwd_kernel[chunk_grid((), triton.cdiv(T, CHUNK), B * H, heads_first, "wy_fwd")](
        k, v, beta, g if g is not None else beta, gam if gam is not None else beta, tm if store_tm else w, w, u0,
        q if q is not None else k, p if p is not None else w, scale, T, H,
        K=K, V=V, BT=CHUNK, BK=block_size(K, cfg.BK), BV=block_size(V, cfg.BV),
        USE_G=g is not None, PREC=dot_precision(dt, cfg.fp32_dots), SOLVE_PREC=solve_precision(dt, cfg.tf32_solve, cfg.fp32_dots),
        STORE_TM=store_tm, HEADS_FIRST=heads_first, STORE_P=p is not None, num_warps=warps(cfg.warps_at(K)),
        num_stages=cfg.num_stages,
    )
    return gam, tm, w, u0
