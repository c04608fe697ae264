"""Masked tile loads and stores for the delta-rule Triton kernels.

Every tensor the kernels touch is a row-major matrix per (batch, head): a [T, D] slice of
[B, T, H, D] (row stride H * D) or a [K, V] state (row stride V). The helpers take the
slice's base pointer, the first row and column of the tile, the matrix extent (rows past
`n_rows` or columns past `n_cols` read as zero and are never written) and the tile shape.
Plain pointer arithmetic rather than block pointers: Triton 3.9 removed those, and the
kernels must build on Triton 3.6 (the GPU) and 3.9 (the CPU interpreter) alike. Offsets
inside a slice are int32 (a slice holds at most T * H * D < 2^31 elements; the caller adds
the slice's start as an int64 scalar): 64-bit offset tiles cost registers the kernels need.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_tile(base, r0, n_rows, stride, c0, n_cols, BR: tl.constexpr, BC: tl.constexpr):
    """[BR, BC] tile M[r0:r0+BR, c0:c0+BC] of a row-major matrix with row stride `stride`."""
    o_r = r0 + tl.arange(0, BR)
    o_c = c0 + tl.arange(0, BC)
    m = (o_r[:, None] < n_rows) & (o_c[None, :] < n_cols)
    return tl.load(base + o_r[:, None] * stride + o_c[None, :], mask=m, other=0.0)


@triton.jit
def load_tile_t(base, r0, n_rows, stride, c0, n_cols, BC: tl.constexpr, BR: tl.constexpr):
    """The transpose of load_tile: [BC, BR] tile whose (c, r) entry is M[r0 + r, c0 + c]."""
    o_r = r0 + tl.arange(0, BR)
    o_c = c0 + tl.arange(0, BC)
    m = (o_c[:, None] < n_cols) & (o_r[None, :] < n_rows)
    return tl.load(base + o_r[None, :] * stride + o_c[:, None], mask=m, other=0.0)


@triton.jit
def store_tile(base, b_x, r0, n_rows, stride, c0, n_cols, BR: tl.constexpr, BC: tl.constexpr):
    """Store b_x [BR, BC] into M[r0:r0+BR, c0:c0+BC], cast to the matrix dtype, in bounds only."""
    o_r = r0 + tl.arange(0, BR)
    o_c = c0 + tl.arange(0, BC)
    m = (o_r[:, None] < n_rows) & (o_c[None, :] < n_cols)
    p = base + o_r[:, None] * stride + o_c[None, :]
    tl.store(p, b_x.to(p.dtype.element_ty), mask=m)


@triton.jit
def load_vec(base, r0, n_rows, stride, BR: tl.constexpr):
    """[BR] fp32 vector x[r0:r0+BR] of a per-token scalar (row stride `stride`), zero past n_rows."""
    o_r = r0 + tl.arange(0, BR)
    return tl.load(base + o_r * stride, mask=o_r < n_rows, other=0.0).to(tl.float32)


@triton.jit
def store_vec(base, b_x, r0, n_rows, stride, BR: tl.constexpr):
    """Store b_x [BR] into x[r0:r0+BR], in bounds only."""
    o_r = r0 + tl.arange(0, BR)
    p = base + o_r * stride
    tl.store(p, b_x.to(p.dtype.element_ty), mask=o_r < n_rows)


@triton.jit
def causal_decay(b_x, b_gr, b_gc, INCLUSIVE: tl.constexpr, USE_G: tl.constexpr):
    """b_x [R, C] times exp(b_gr[r] - b_gc[c]) where r >= c (r > c unless INCLUSIVE), else 0.

    Row and column indices are the tile's own (same chunk). The exponent is masked before
    exp, so entries above the diagonal (positive exponents) never overflow."""
    o_r = tl.arange(0, b_x.shape[0])
    o_c = tl.arange(0, b_x.shape[1])
    if INCLUSIVE:
        m = o_r[:, None] >= o_c[None, :]
    else:
        m = o_r[:, None] > o_c[None, :]
    if USE_G:
        d = tl.where(m, b_gr[:, None] - b_gc[None, :], float("-inf"))
        return b_x * tl.exp(d)
    return tl.where(m, b_x, 0.0)


@triton.jit
def anticausal_decay(b_x, b_gr, b_gc, INCLUSIVE: tl.constexpr, USE_G: tl.constexpr):
    """The transposed mask: b_x [R, C] times exp(b_gc[c] - b_gr[r]) where c >= r (c > r
    unless INCLUSIVE), else 0. For tiles computed directly in transposed orientation."""
    o_r = tl.arange(0, b_x.shape[0])
    o_c = tl.arange(0, b_x.shape[1])
    if INCLUSIVE:
        m = o_c[None, :] >= o_r[:, None]
    else:
        m = o_c[None, :] > o_r[:, None]
    if USE_G:
        d = tl.where(m, b_gc[None, :] - b_gr[:, None], float("-inf"))
        return b_x * tl.exp(d)
    return tl.where(m, b_x, 0.0)


@triton.jit
def load_gamma(base, r0, n_rows, stride, BR: tl.constexpr):
    """[BR] cumulative log-gates gamma[r0:r0+BR] with rows past n_rows repeating the last real
    row: gamma is flat over padding (padded tokens decay nothing), so exp(gamma_i - gamma_j)
    never exceeds 1 for i >= j, padded rows included (zero padding would overflow it)."""
    o_r = tl.minimum(r0 + tl.arange(0, BR), n_rows - 1)
    return tl.load(base + o_r * stride).to(tl.float32)
