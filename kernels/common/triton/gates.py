"""The gate unit of every Triton kernel: log-gates in log2 units, decays by exp2.

An op takes natural-log gates g <= 0 (a token's forget factor is e^g). The kernels multiply
them by LOG2E once, as they load them or in their chunk-local cumulative sums, and form every
decay as exp2 of a difference of such sums: exp2(LOG2E x) == e^x, and exp2 is the
instruction the GPU has. Gradients are taken with respect to the natural-log gates: a decay
factor's value does not depend on the unit it was computed in, so the backward formulas
(d e^x / dx = e^x) read the same factors.

Each per-token log2-gate below GATE_FLOOR_LOG2 (-inf, a full reset, included) is raised to
it before any sum. Decays are differences gamma_i - gamma_j of chunk-local sums, and one
-inf would make every later difference in its chunk -inf - (-inf) = NaN; 2^-80 leaves
nothing of a state fp32 can hold. The floor sits below the vector-gate kernels' factored
span (64, gated_linear_attention/triton_vector.FACTORED_SPAN), so a gate it raises still
sends its chunk down the path its true value would, and close enough to keep the sums
small: every decay inherits their rounding, ulp(|gamma|), 2^-17 past one floored gate while
the rest of the chunk's gates sum above -48.

Gate modes, passed to kernels as a constexpr: GATE_NONE (ungated), GATE_SCALAR (one gate
per token and head, [B, T, H]), GATE_VECTOR (one per key channel, [B, T, H, K]).
"""

from __future__ import annotations

import triton
import triton.language as tl

# exp(x) == exp2(x * LOG2E)
LOG2E = 1.4426950408889634
GATE_FLOOR_LOG2 = -80.0

GATE_NONE, GATE_SCALAR, GATE_VECTOR = 0, 1, 2

# the same two numbers as jit-visible constants (a kernel may only read constexpr globals)
LOG2E_C = tl.constexpr(LOG2E)
GATE_FLOOR_C = tl.constexpr(GATE_FLOOR_LOG2)


@triton.jit
def log2_gates(b_g):
    """Natural-log gates (any shape, any float dtype) -> fp32 log2-gates raised to the floor."""
    return tl.maximum(b_g.to(tl.float32) * LOG2E_C, GATE_FLOOR_C)


@triton.jit
def causal_decay(b_x, b_gr, b_gc, INCLUSIVE: tl.constexpr, USE_G: tl.constexpr):
    """b_x [R, C] times exp2(b_gr[r] - b_gc[c]) where r >= c (r > c unless INCLUSIVE), else 0.

    b_gr [R], b_gc [C]: cumulative log2-gates of the tile's rows and columns, indexed from
    the same chunk start. The exponent is masked before exp2, so entries above the diagonal
    (positive exponents) never overflow. USE_G False: the mask alone."""
    o_r = tl.arange(0, b_x.shape[0])
    o_c = tl.arange(0, b_x.shape[1])
    if INCLUSIVE:
        m_rc = o_r[:, None] >= o_c[None, :]
    else:
        m_rc = o_r[:, None] > o_c[None, :]
    if USE_G:
        b_d = tl.where(m_rc, b_gr[:, None] - b_gc[None, :], float("-inf"))
        return b_x * tl.exp2(b_d)
    return tl.where(m_rc, b_x, 0.0)


@triton.jit
def anticausal_decay(b_x, b_gr, b_gc, INCLUSIVE: tl.constexpr, USE_G: tl.constexpr):
    """The transposed mask: b_x [R, C] times exp2(b_gc[c] - b_gr[r]) where c >= r (c > r
    unless INCLUSIVE), else 0. For tiles computed directly in transposed orientation."""
    o_r = tl.arange(0, b_x.shape[0])
    o_c = tl.arange(0, b_x.shape[1])
    if INCLUSIVE:
        m_rc = o_c[None, :] >= o_r[:, None]
    else:
        m_rc = o_c[None, :] > o_r[:, None]
    if USE_G:
        b_d = tl.where(m_rc, b_gc[None, :] - b_gr[:, None], float("-inf"))
        return b_x * tl.exp2(b_d)
    return tl.where(m_rc, b_x, 0.0)


# The gate gradient without cancellation. A chunk's dg sums products whose O(1) parts cancel
# under strong gates (each token's own pair term, a state term counted in a total and again in
# a running sum); the two helpers below sum only the terms that survive, so fp32 leaves dg an
# error as small as the decays in it rather than eps32 e^|g|.


@triton.jit
def pair_gate_grad(b_p):
    """[BT, BT] pair terms p_ij of a chunk -> [BT]: sum_{j < t} p_tj - sum_{i > t} p_it, the
    intra-chunk share of d gamma_t from the strictly lower part only (the diagonal cancels
    between the two sums and is never added)."""
    o = tl.arange(0, b_p.shape[0])
    b_low = tl.where(o[:, None] > o[None, :], b_p, 0.0)
    return tl.sum(b_low, axis=1) - tl.sum(b_low, axis=0)


@triton.jit
def sum_before(b_x):
    """[BT] -> [BT]: sum_{j < t} x_j term by term (an inclusive running sum less x_t would
    cancel to the rounding of the larger terms)."""
    o = tl.arange(0, b_x.shape[0])
    return tl.sum(tl.where(o[:, None] > o[None, :], b_x[None, :], 0.0), axis=1)


@triton.jit
def _before_combine(a_before, a_last, b_before, b_last):
    return a_before + a_last + b_before, b_last


@triton.jit
def rows_before(b_x):
    """[BT, BK] -> [BT, BK]: column by column, sum_{j < t} x_jc, as an exclusive scan that
    never adds x_t (sum_before for a tile: an inclusive cumsum less x_t would cancel)."""
    b_before, _ = tl.associative_scan((tl.zeros_like(b_x), b_x), 0, _before_combine)
    return b_before
