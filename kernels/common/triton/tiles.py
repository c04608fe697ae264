"""The tile library of every Triton kernel: masked loads and stores of 2-D tiles of
row-major matrices and of 1-D per-token vectors (plain pointers: block pointers are gone
from recent Triton, and tensor descriptors need TMA-aligned shapes).

A matrix here is `ptr` with n_rows x n_cols elements, rows `stride` elements apart: e.g.
one head's keys are k + ((b*T*H + h) * K) with n_rows = T, n_cols = K, stride = H*K, and a
[K, V] state is its base with n_rows = K, n_cols = V, stride = V. Every helper takes the
tile's first row and column, then the matrix extent, then the stride, then the tile shape:
    load_tile(ptr, row0, col0, n_rows, n_cols, stride, BR, BCOL) -> [BR, BCOL]
A per-token vector (a scalar gate, beta) is `ptr` with n_rows entries `stride` apart:
    load_vec(ptr, row0, n_rows, stride, BR) -> [BR]
Out-of-range elements load as zero and are not stored (load_gamma_rows excepted). A
tile's first element is addressed in int64 (row0 x stride of a long sequence of many heads
passes 2^31), the offsets inside the tile in int32: a whole tile of int64 offsets costs
registers that spill in the larger kernels. So BR x stride stays below 2^31.
chunk_gram multiplies one chunk's rows of two such matrices (x y^T over K, block by block).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_tile(ptr, row0, col0, n_rows, n_cols, stride, BR: tl.constexpr, BCOL: tl.constexpr):
    """Rows row0..row0+BR-1, columns col0..col0+BCOL-1: a [BR, BCOL] tile."""
    o_r = tl.arange(0, BR)
    o_c = tl.arange(0, BCOL)
    m = ((row0 + o_r) < n_rows)[:, None] & ((col0 + o_c) < n_cols)[None, :]
    p_tile = ptr + tl.cast(row0, tl.int64) * stride + col0
    return tl.load(p_tile + o_r[:, None] * stride + o_c[None, :], mask=m, other=0.0)


@triton.jit
def load_tile_t(ptr, row0, col0, n_rows, n_cols, stride, BR: tl.constexpr, BCOL: tl.constexpr):
    """The same tile as load_tile, transposed: [BCOL, BR]."""
    o_r = tl.arange(0, BR)
    o_c = tl.arange(0, BCOL)
    m = ((row0 + o_r) < n_rows)[None, :] & ((col0 + o_c) < n_cols)[:, None]
    p_tile = ptr + tl.cast(row0, tl.int64) * stride + col0
    return tl.load(p_tile + o_r[None, :] * stride + o_c[:, None], mask=m, other=0.0)


@triton.jit
def store_tile(ptr, value, row0, col0, n_rows, n_cols, stride, BR: tl.constexpr, BCOL: tl.constexpr):
    """Store a [BR, BCOL] tile (cast to the pointer's dtype) where it lies inside the matrix."""
    o_r = tl.arange(0, BR)
    o_c = tl.arange(0, BCOL)
    m = ((row0 + o_r) < n_rows)[:, None] & ((col0 + o_c) < n_cols)[None, :]
    p_tile = ptr + tl.cast(row0, tl.int64) * stride + col0
    tl.store(p_tile + o_r[:, None] * stride + o_c[None, :], value.to(ptr.dtype.element_ty), mask=m)


@triton.jit
def load_row(ptr, row, col0, n_rows, n_cols, stride, BCOL: tl.constexpr):
    """One row (a [BCOL] vector), zeros outside the matrix."""
    o_c = col0 + tl.arange(0, BCOL)
    # row broadcast to the vector's shape: a scalar-and-vector mask trips the interpreter
    m = (o_c < n_cols) & ((o_c * 0 + row) < n_rows)
    return tl.load(ptr + row.to(tl.int64) * stride + o_c, mask=m, other=0.0)


@triton.jit
def load_gamma_rows(ptr, row0, n_rows, stride, BR: tl.constexpr):
    """Rows row0..row0+BR-1 of a per-token vector (a scalar gate's cumulative log2-gates,
    `stride` elements apart): [BR], rows past n_rows reading row n_rows - 1. Padded tokens
    have zero gates, so their gamma is the last real row's and every decay
    exp2(gamma_i - gamma_j), i >= j, stays <= 1 on padded rows too; zeros there would give
    exp2(-gamma_j), which overflows once a chunk's gates pass 128 log2-units, and a padded
    row's zero times it is NaN."""
    o_r = tl.minimum(row0 + tl.arange(0, BR), n_rows - 1)
    return tl.load(ptr + o_r * stride)


@triton.jit
def load_vec(ptr, row0, n_rows, stride, BR: tl.constexpr):
    """Rows row0..row0+BR-1 of a per-token vector: [BR] fp32, zeros past n_rows."""
    o_r = row0 + tl.arange(0, BR)
    return tl.load(ptr + o_r.to(tl.int64) * stride, mask=o_r < n_rows, other=0.0).to(tl.float32)


@triton.jit
def store_vec(ptr, value, row0, n_rows, stride, BR: tl.constexpr):
    """Store a [BR] vector (cast to the pointer's dtype) into rows row0..row0+BR-1, in bounds only."""
    o_r = row0 + tl.arange(0, BR)
    tl.store(ptr + o_r.to(tl.int64) * stride, value.to(ptr.dtype.element_ty), mask=o_r < n_rows)


@triton.jit
def chunk_gram(x, y, seq, t0, T, H, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """[BT, BT] fp32: rows t0 .. t0 + BT - 1 of one head of x times the same rows of y,
    transposed (x_a . y_b), summed over K in BK-wide blocks; x, y: [B, T, H, K] with this
    head's row 0 at element offset seq * K. Rows past T count as zero."""
    b_xy = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_x = load_tile(x + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_yt = load_tile_t(y + seq * K, t0, i_k * BK, T, K, H * K, BT, BK)
        b_xy += tl.dot(b_x, b_yt, input_precision=PREC)
    return b_xy
