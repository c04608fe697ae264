"""Triton building blocks of MesaNet's chunk systems (docs/design.md §8, §10): gate factors built
from segment sums, the implicit per-token matrices M_i and the on-chip conjugate gradient.

Within a chunk of BT tokens with per-token log-gates g (natural log; the kernels work in
log2 units, exp2(LOG2E g) = e^g):

    seg_ij   = g_{j+1} + ... + g_i                       (i >= j; a sum of terms of one sign)
    W_ij     = exp(seg_ij) beta_j  for i >= j, else 0    (Gamma diag(beta))
    d_i      = exp(g_1 + ... + g_i)                      (decay from the chunk start)
    u_j      = beta_j exp(g_{j+1} + ... + g_BT)          (weight of token j in the state leaving)
    M_i p    = d_i H0 p + sum_j W_ij (k_j . p) k_j + lamb ⊙ p

Every exponent is a sum of same-sign terms, never a difference of two cumulative sums (which
loses digits when |gamma| is large, see kernels/mesa/system.py). The segment sums of a block
of rows are one exact 0/1-matrix product ("ieee" dot: products by 1.0 are exact).

All tiles are fp32 whatever the input dtype; `PREC` is the tl.dot input precision of the
mat-vec ("ieee" for fp32 inputs, "tf32" or "tf32x3" for 16-bit inputs on a GPU).
Row vectors of a block are indexed by i (rows of the block), columns by j (tokens of the chunk).

The CG programs load H0^T and the chunk's keys once and hold them on chip through every
iteration (no global reads inside the loop), so each mat-vec of the loop reads only on-chip
tiles; the 32-row programs, the prologue and the fp16 operands all assume this resident form.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common.triton.gates import log2_gates
from kernels.common.triton.tiles import load_tile, load_tile_t

FP32_TINY = tl.constexpr(1.1754943508222875e-38)  # smallest normal fp32: guards the CG divisions
# below this bound on ||p|| a row's CG has converged past fp32 (its squares flush to zero on
# the GPU, so ||r||^2 reads 0 while r is not): matvec_normed drops such a p instead of
# scaling it by 1 / FP32_TINY into fp16 infinities
NORM_FLOOR = tl.constexpr(1e-18)


@triton.jit
def load_gates(g, beta, seq, t0, T, H, BT: tl.constexpr):
    """log2-unit gates (raised to the gate floor of kernels/common/triton/gates.py: a -inf
    gate, a full reset, counts as a decay of 2^-80, so the 0/1-matrix segment sums never
    meet 0 * -inf) and betas of one chunk, [BT] fp32 each, zero
    past T (a neutral pad)."""
    o_j = t0 + tl.arange(0, BT)
    m_j = o_j < T
    b_g = log2_gates(tl.load(g + seq + o_j * H, mask=m_j, other=0.0))
    b_beta = tl.load(beta + seq + o_j * H, mask=m_j, other=0.0).to(tl.float32)
    return b_g, b_beta


@triton.jit
def chunk_weights(b_g, b_beta, i0, BR: tl.constexpr, BT: tl.constexpr, SCAN: tl.constexpr):
    """For rows i0 .. i0+BR-1 of a chunk (positions inside the chunk):
    W [BR, BT] = Gamma_ij beta_j (zero above the diagonal), Gamma [BR, BT] and d [BR].
    SCAN: segment sums by a running sum down the rows instead of the 0/1-matrix product
    (the same same-sign terms in another order; no fp32 FMA dot, which costs about
    BR * BT * BT / threads FMAs and registers in the prologue of every CG program)."""
    o_i = i0 + tl.arange(0, BR)
    o_j = tl.arange(0, BT)
    b_upto = tl.where(o_j[None, :] <= o_i[:, None], 1.0, 0.0)  # [BR, BT(s)]
    if SCAN:
        # seg[i, j] = (g_s of the chunk's rows before this block, s > j) + (running sum of
        # g_s down the block's rows, s > j); the gates of the block's rows are picked out
        # of b_g by a masked sum (adding zeros is exact)
        b_g_rows = tl.sum(tl.where(o_j[None, :] == o_i[:, None], b_g[None, :], 0.0), axis=1)  # [BR]
        m_before = (o_j[:, None] > o_j[None, :]) & (o_j[:, None] < i0)  # [BT(s), BT(j)]
        b_before = tl.sum(tl.where(m_before, b_g[:, None], 0.0), axis=0)  # [BT(j)]
        b_seg = b_before[None, :] + tl.cumsum(tl.where(o_i[:, None] > o_j[None, :], b_g_rows[:, None], 0.0), axis=0)
    else:
        # seg[i, j] = sum_s [s <= i] [s > j] g_s as a product of a 0/1 matrix and masked gates
        b_after = tl.where(o_j[:, None] > o_j[None, :], b_g[:, None], 0.0)  # [BT(s), BT(j)]
        b_seg = tl.dot(b_upto, b_after, input_precision="ieee")
    b_gamma = tl.where(o_i[:, None] >= o_j[None, :], tl.exp2(b_seg), 0.0)
    b_d = tl.exp2(tl.sum(b_upto * b_g[None, :], axis=1))
    return b_gamma * b_beta[None, :], b_gamma, b_d


@triton.jit
def decay_to_end(b_g, BT: tl.constexpr):
    """exp(g_{j+1} + ... + g_BT) for every token j of a chunk ([BT]; u_j = beta_j times it)
    and the chunk decay exp(g_1 + ... + g_BT)."""
    o_j = tl.arange(0, BT)
    b_later = tl.sum(tl.where(o_j[None, :] > o_j[:, None], b_g[None, :], 0.0), axis=1)
    return tl.exp2(b_later), tl.exp2(tl.sum(b_g))


@triton.jit
def system_rows(b_k, g, beta, lamb, h_kk, seq, t0, i0, i_h, T,
                H, K: tl.constexpr, BT: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                SCAN: tl.constexpr, DIAG_PREC: tl.constexpr):
    """The row data of the implicit M_i, rows i0 .. i0+BR-1 of the chunk starting at t0,
    given the chunk's keys b_k [BT, BK] fp32 (zero past T and past K).

    h_kk points at the K x K state entering the chunk. Returns (W [BR, BT], d [BR], lamb
    [BK] (1 in padded columns, so padding stays zero and never divides by zero),
    diag(M_i) [BR, BK]). SCAN: see chunk_weights; DIAG_PREC: the dot precision of diag(M_i),
    which only sets the Jacobi start ("ieee": fp32 FMAs; the CG loop's precision runs on
    tensor cores)."""
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    b_g, b_beta = load_gates(g, beta, seq, t0, T, H, BT)
    b_w, _, b_d = chunk_weights(b_g, b_beta, i0, BR, BT, SCAN)
    b_h0_diag = tl.load(h_kk + o_k * (K + 1), mask=m_k, other=0.0)
    b_lamb = tl.load(lamb + i_h * K + o_k, mask=m_k, other=1.0).to(tl.float32)
    b_diag = (b_d[:, None] * b_h0_diag[None, :] + tl.dot(b_w, b_k * b_k, input_precision=DIAG_PREC)
              + b_lamb[None, :])
    return b_w, b_d, b_lamb, b_diag


@triton.jit
def load_system(k, g, beta, lamb, h_kk, seq, t0, i0, i_h, T,
                      H, K: tl.constexpr, BT: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                      SCAN: tl.constexpr, DIAG_PREC: tl.constexpr):
    """system_rows plus what the mat-vec keeps on chip: returns (W, d,
    lamb, diag(M_i)) as system_rows, then H0^T [BK, BK] and the chunk's keys [BT, BK], fp32
    (converted once here: the conversion would be hoisted out of the CG loop anyway)."""
    b_k = load_tile(k + seq * K, t0, 0, T, K, H * K, BT, BK).to(tl.float32)
    b_h0t = load_tile_t(h_kk, 0, 0, K, K, K, BK, BK)
    b_w, b_d, b_lamb, b_diag = system_rows(b_k, g, beta, lamb, h_kk, seq, t0, i0, i_h, T, H, K, BT, BR, BK,
                                           SCAN, DIAG_PREC)
    return b_w, b_d, b_lamb, b_diag, b_h0t, b_k


@triton.jit
def matvec(b_p, b_h0t, b_k, b_w, b_d, b_lamb, PREC: tl.constexpr):
    """Rows M_i p_i for a block of rows p [BR, BK] from tiles already on chip: b_h0t [BK, BK]
    = H0^T (p H0^T, the torch path's convention, so that d(y^T M x)/dH0 = y x^T) and the
    chunk's keys b_k [BT, BK], both fp32.
    K^T is the same key tile transposed on chip, not a second copy read from memory."""
    b_mp = tl.dot(b_p, b_h0t, input_precision=PREC) * b_d[:, None]
    b_a = tl.dot(b_p, tl.trans(b_k), input_precision=PREC) * b_w  # [BR, BT]: (k_j . p_i) W_ij
    b_mp += tl.dot(b_a, b_k, input_precision=PREC)
    return b_mp + b_p * b_lamb[None, :]


@triton.jit
def scaled_half_rows(b_x):
    """b_x [R, C] as fp16 with each row divided by its largest magnitude, and those scales
    [R]: every entry within 2^14 of its row's largest keeps fp16's 11 significant bits,
    tf32's precision; smaller ones lose bits only below 2^-24 of the largest (a zero row
    stays zero)."""
    b_s = tl.maximum(tl.max(tl.abs(b_x), axis=1), FP32_TINY)
    return (b_x / b_s[:, None]).to(tl.float16), b_s


@triton.jit
def scaled_half_tile(b_x):
    """scaled_half_rows with one scale for the whole tile (a scalar). Two functions rather
    than one with a constexpr axis=None: Triton 3.9 no longer takes that None branch when
    compiling (the CPU interpreter does), found by compiling for sm_90 on a CPU machine."""
    b_s = tl.maximum(tl.max(tl.max(tl.abs(b_x), axis=1), axis=0), FP32_TINY)
    return (b_x / b_s).to(tl.float16), b_s


@triton.jit
def matvec_half(b_p, b_h0t16, s_h, b_k16, s_k, b_w, b_d, b_lamb):
    """matvec with fp16 tensor-core operands (twice tf32's rate, half the registers):
    H0^T and the keys come pre-scaled (scaled_half_tile, scales s_h, s_k), each row
    of p and of the intermediate (k_j . p_i) W_ij is scaled the same way here, and the fp32
    products are scaled back."""
    b_p16, s_p = scaled_half_rows(b_p)
    b_mp = tl.dot(b_p16, b_h0t16) * (s_p * s_h * b_d)[:, None]
    b_a = tl.dot(b_p16, tl.trans(b_k16)) * (s_p * s_k)[:, None] * b_w
    b_a16, s_a = scaled_half_rows(b_a)
    b_mp += tl.dot(b_a16, b_k16) * (s_a * s_k)[:, None]
    return b_mp + b_p * b_lamb[None, :]


@triton.jit
def matvec_normed(b_p, s_p, b_h0t16, s_h, b_k16, s_k, b_w, b_d, b_lamb):
    """matvec_half without its two row-max reductions per call: p is scaled by s_p [BR], an
    upper bound of each row's 2-norm that the CG loop carries (cg_update_normed), so p / s_p
    has entries of at most 1; then (k_j . p_i / s_p) W_ij is bounded by the keys' tile-scaled
    norms (at most sqrt(K), W <= 1) and goes to fp16 unscaled. Same 11 significant bits for
    every entry within 2^14 of its row's largest, give or take the bound's slack (< 2.5x).
    A row with s_p <= NORM_FLOOR has converged: its mat-vec is lamb * p alone."""
    b_inv = tl.where(s_p > NORM_FLOOR, 1.0 / tl.maximum(s_p, NORM_FLOOR), 0.0)
    b_p16 = (b_p * b_inv[:, None]).to(tl.float16)
    b_mp = tl.dot(b_p16, b_h0t16) * (s_p * s_h * b_d)[:, None]
    b_a16 = (tl.dot(b_p16, tl.trans(b_k16)) * b_w).to(tl.float16)
    b_mp += tl.dot(b_a16, b_k16) * (s_p * s_k * s_k)[:, None]
    return b_mp + b_p * b_lamb[None, :]


@triton.jit
def cg_update_normed(b_x, b_r, b_p, b_rr, b_s, b_mp):
    """cg_update that also carries b_s >= ||p_i||, the scale of matvec_normed, with no
    reduction over the row: p <- r + beta p gives ||p|| <= ||r|| + beta ||p|| (the triangle
    inequality, whatever orthogonality CG has lost in rounding; the norm recurrence
    ||r||^2 + beta^2 ||p||^2 assumes r orthogonal to p and underestimated ||p|| enough on the
    H200 to overflow fp16). The bound stays within 1 / (sqrt(2) - 1) ~ 2.4x of ||p||."""
    b_alpha = b_rr / tl.maximum(tl.sum(b_p * b_mp, axis=1), FP32_TINY)
    b_x += b_alpha[:, None] * b_p
    b_r -= b_alpha[:, None] * b_mp
    b_rr_next = tl.sum(b_r * b_r, axis=1)
    b_beta = b_rr_next / tl.maximum(b_rr, FP32_TINY)
    b_p = b_r + b_beta[:, None] * b_p
    return b_x, b_r, b_p, b_rr_next, tl.sqrt(b_rr_next) + b_beta * b_s


@triton.jit
def cg_update(b_x, b_r, b_p, b_rr, b_mp):
    """One conjugate-gradient update of every row (each row is its own system) given the
    rows M_i p_i in b_mp; b_rr holds ||r_i||^2. Returns x, r, p and the new ||r_i||^2."""
    b_alpha = b_rr / tl.maximum(tl.sum(b_p * b_mp, axis=1), FP32_TINY)
    b_x += b_alpha[:, None] * b_p
    b_r -= b_alpha[:, None] * b_mp
    b_rr_next = tl.sum(b_r * b_r, axis=1)
    b_p = b_r + (b_rr_next / tl.maximum(b_rr, FP32_TINY))[:, None] * b_p
    return b_x, b_r, b_p, b_rr_next


@triton.jit
def cg_solve(b_b, b_h0t, b_k, b_w, b_d, b_lamb, b_diag, steps, tol2,
             HAS_TOL: tl.constexpr, PREC: tl.constexpr, HALF: tl.constexpr = 0):
    """x with M_i x_i = b_i for every row, from the Jacobi start b / diag(M): `steps` CG
    iterations, or fewer with HAS_TOL once every row of this block has
    ||r||^2 <= tol2 ||b||^2 (the check the torch path makes, per block instead of globally).
    H0^T [BK, BK] and the keys [BT, BK] (fp32) come loaded by the caller and stay on chip
    across all iterations, so an iteration does no global reads. HALF: 0, PREC dots on fp32 tiles; 1,
    the mat-vecs on scaled fp16 operands (matvec_half, rows scaled by their largest entry);
    2, the same with rows scaled by their carried norm (matvec_normed)."""
    if HALF == 2:
        return cg_solve_normed(b_b, b_h0t, b_k, b_w, b_d, b_lamb, b_diag, steps, tol2, HAS_TOL)
    if HALF == 1:
        b_h0t16, s_h = scaled_half_tile(b_h0t)
        b_k16, s_k = scaled_half_tile(b_k)
        b_x = b_b / b_diag
        b_r = b_b - matvec_half(b_x, b_h0t16, s_h, b_k16, s_k, b_w, b_d, b_lamb)
    else:
        b_x = b_b / b_diag
        b_r = b_b - matvec(b_x, b_h0t, b_k, b_w, b_d, b_lamb, PREC)
    b_p = b_r
    b_rr = tl.sum(b_r * b_r, axis=1)
    if HAS_TOL:
        b_stop = tol2 * tl.sum(b_b * b_b, axis=1)
        i = steps * 0
        while (i < steps) & (tl.max(b_rr - b_stop, axis=0) > 0):
            if HALF == 1:
                b_mp = matvec_half(b_p, b_h0t16, s_h, b_k16, s_k, b_w, b_d, b_lamb)
            else:
                b_mp = matvec(b_p, b_h0t, b_k, b_w, b_d, b_lamb, PREC)
            b_x, b_r, b_p, b_rr = cg_update(b_x, b_r, b_p, b_rr, b_mp)
            i += 1
    else:
        for _ in range(steps):
            if HALF == 1:
                b_mp = matvec_half(b_p, b_h0t16, s_h, b_k16, s_k, b_w, b_d, b_lamb)
            else:
                b_mp = matvec(b_p, b_h0t, b_k, b_w, b_d, b_lamb, PREC)
            b_x, b_r, b_p, b_rr = cg_update(b_x, b_r, b_p, b_rr, b_mp)
    return b_x


@triton.jit
def cg_solve_normed(b_b, b_h0t, b_k, b_w, b_d, b_lamb, b_diag, steps, tol2, HAS_TOL: tl.constexpr):
    """cg_solve with HALF = 2: the start's scale is its true norm (one reduction, once),
    every later one the bound on ||p|| carried by cg_update_normed."""
    b_h0t16, s_h = scaled_half_tile(b_h0t)
    b_k16, s_k = scaled_half_tile(b_k)
    b_x = b_b / b_diag
    s_x = tl.sqrt(tl.sum(b_x * b_x, axis=1))
    b_r = b_b - matvec_normed(b_x, s_x, b_h0t16, s_h, b_k16, s_k, b_w, b_d, b_lamb)
    b_p = b_r
    b_rr = tl.sum(b_r * b_r, axis=1)
    b_s = tl.sqrt(b_rr)  # ||p|| exactly, at the start (p = r)
    if HAS_TOL:
        b_stop = tol2 * tl.sum(b_b * b_b, axis=1)
        i = steps * 0
        while (i < steps) & (tl.max(b_rr - b_stop, axis=0) > 0):
            b_mp = matvec_normed(b_p, b_s, b_h0t16, s_h, b_k16, s_k, b_w, b_d, b_lamb)
            b_x, b_r, b_p, b_rr, b_s = cg_update_normed(b_x, b_r, b_p, b_rr, b_s, b_mp)
            i += 1
    else:
        for _ in range(steps):
            b_mp = matvec_normed(b_p, b_s, b_h0t16, s_h, b_k16, s_k, b_w, b_d, b_lamb)
            b_x, b_r, b_p, b_rr, b_s = cg_update_normed(b_x, b_r, b_p, b_rr, b_s, b_mp)
    return b_x
