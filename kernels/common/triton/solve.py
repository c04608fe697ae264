"""Inverse of a unit lower-triangular chunk matrix, (I + A)^{-1}, in Triton registers.

The WY/UT form of the delta rule (docs/design.md §10) needs Tm = (I + A)^{-1} for the strictly
lower-triangular A of each chunk. A 64 x 64 chunk is handled as a 4 x 4 grid of 16 x 16
blocks (A_ij, i >= j; diagonal blocks strictly lower):

    diagonal:  T_ii = (I + A_ii)^{-1}  by recursive doubling: with T the inverse of the
               block-diagonal part at block size s, and N the part of A coupling the two
               halves of each 2s-block, (D + N)^{-1} = T - T N T exactly (N T N = 0 there);
               four levels, s = 1, 2, 4, 8
    below it:  T_ij = -T_ii sum_{j <= m < i} A_im T_mj   (block forward substitution)

which follows from row i of (I + A) T = I. Recursive triangular inversion is as accurate as
forward substitution (Du Croz and Higham, 1992) and needs 4 sequential steps per block
instead of 15. All products are 16 x 16 x 16 in fp32 ("ieee" dots), so the inverse is as
exact as fp32 allows on any GPU and under TRITON_INTERPRET=1.

    unit_lower_inverse_16(b_a, ..., PREC) b_a [16, 16] fp32, strictly lower -> (I + b_a)^{-1}
    unit_lower_inverse_64(a00, ..., a33, PREC) the ten blocks of A -> the ten blocks of Tm

No block is ever transposed here: on Hopper with Triton 3.4 to 3.7.0, feeding tl.trans of
a dot result to another dot miscompiles (flash-linear-attention issue 640).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def unit_lower_inverse_16(b_a, m2, m4, m8, PREC: tl.constexpr):
    """(I + b_a)^{-1} for b_a [16, 16] fp32 strictly lower triangular, by recursive doubling.

    m2, m4, m8: [16, 16] masks of the entries coupling the two halves of each 2s-block
    (row in the second half, column in the first), s = 2, 4, 8. At s = 1 the inverse of the
    block-diagonal part is I, so that level is T = I - N."""
    o_r = tl.arange(0, 16)
    m1 = (o_r[:, None] == o_r[None, :] + 1) & (o_r[:, None] % 2 == 1)
    b_t = tl.where(o_r[:, None] == o_r[None, :], 1.0, tl.where(m1, -b_a, 0.0))
    b_t -= tl.dot(b_t, tl.dot(tl.where(m2, b_a, 0.0), b_t, input_precision=PREC), input_precision=PREC)
    b_t -= tl.dot(b_t, tl.dot(tl.where(m4, b_a, 0.0), b_t, input_precision=PREC), input_precision=PREC)
    b_t -= tl.dot(b_t, tl.dot(tl.where(m8, b_a, 0.0), b_t, input_precision=PREC), input_precision=PREC)
    return b_t


@triton.jit
def unit_lower_inverse_64(a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, PREC: tl.constexpr):
    """Blocks of (I + A)^{-1} for a 64 x 64 strictly lower A given as 16 x 16 fp32 blocks
    a_ij (row block i, column block j, i >= j; the a_ii strictly lower).

    Returns (t00, t10, t11, t20, t21, t22, t30, t31, t32, t33); blocks above the diagonal
    of the inverse are zero."""
    o_r = tl.arange(0, 16)
    r, c = o_r[:, None], o_r[None, :]
    m2 = ((r // 4) == (c // 4)) & ((r // 2) > (c // 2))
    m4 = ((r // 8) == (c // 8)) & ((r // 4) > (c // 4))
    m8 = (r // 8) > (c // 8)
    t00 = unit_lower_inverse_16(a00, m2, m4, m8, PREC)
    t11 = unit_lower_inverse_16(a11, m2, m4, m8, PREC)
    t22 = unit_lower_inverse_16(a22, m2, m4, m8, PREC)
    t33 = unit_lower_inverse_16(a33, m2, m4, m8, PREC)
    t10 = -tl.dot(t11, tl.dot(a10, t00, input_precision=PREC), input_precision=PREC)
    t21 = -tl.dot(t22, tl.dot(a21, t11, input_precision=PREC), input_precision=PREC)
    t20 = -tl.dot(t22, tl.dot(a20, t00, input_precision=PREC) + tl.dot(a21, t10, input_precision=PREC),
                  input_precision=PREC)
    t32 = -tl.dot(t33, tl.dot(a32, t22, input_precision=PREC), input_precision=PREC)
    t31 = -tl.dot(t33, tl.dot(a31, t11, input_precision=PREC) + tl.dot(a32, t21, input_precision=PREC),
                  input_precision=PREC)
    t30 = -tl.dot(t33, tl.dot(a30, t00, input_precision=PREC) + tl.dot(a31, t10, input_precision=PREC)
                  + tl.dot(a32, t20, input_precision=PREC), input_precision=PREC)
    return t00, t10, t11, t20, t21, t22, t30, t31, t32, t33
