"""Prefix sums down the rows of a tile, by scan or on the tensor cores.

Inside a sequential loop (a state pass or a scan walking its chunks) `tl.cumsum` over a
[BR, BC] tile is a shuffle-and-shared-memory scan on the loop's critical path; a product with
a triangular matrix of ones is a few tensor-core instructions instead. A 16-bit tile goes in
as it is: each term x_j * 1 is exact and the sums are fp32, as the scan's (in another order).
An fp32 tile goes in as two bf16 parts, hi = bf16(x) and lo = bf16(x - hi), with fp32's
range: each term within 2^-17 of x where the conversion rounds to nearest (the GPU's), 2^-14
where it truncates (the interpreter's). Enough for sums that end in a 16-bit tensor (bf16
keeps 2^-9, fp16 2^-12), not for fp32 outputs, whose callers keep the scan. tf32 is
not used: its 10-bit mantissa would round x itself.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_prefix_sums(b_x, BR: tl.constexpr, BY_DOT: tl.constexpr, REVERSE: tl.constexpr = False):
    """[BR, BC] fp32 sums down the rows of b_x [BR, BC]: row i holds x_0 + ... + x_i, or
    x_i + ... + x_last when REVERSE. BY_DOT (BR >= 16): a product with triangular ones, an
    fp32 b_x split in two bf16 parts (module docstring); else tl.cumsum in fp32."""
    if BY_DOT:
        o_r = tl.arange(0, BR)
        if REVERSE:
            b_tri = o_r[:, None] <= o_r[None, :]
        else:
            b_tri = o_r[:, None] >= o_r[None, :]
        if b_x.dtype == tl.float32:
            b_ones = tl.where(b_tri, 1.0, 0.0).to(tl.bfloat16)
            b_hi = b_x.to(tl.bfloat16)
            b_lo = (b_x - b_hi.to(tl.float32)).to(tl.bfloat16)
            return tl.dot(b_ones, b_hi) + tl.dot(b_ones, b_lo)
        return tl.dot(tl.where(b_tri, 1.0, 0.0).to(b_x.dtype), b_x)
    return tl.cumsum(b_x.to(tl.float32), axis=0, reverse=REVERSE)
