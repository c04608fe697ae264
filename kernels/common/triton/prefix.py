"""Prefix sums down the rows of a tile, by scan or on the tensor cores.

Inside a sequential loop (a state pass walking its chunks) `tl.cumsum` over a [BT, BD] tile
is a shuffle-and-shared-memory scan on the critical path; a product with a triangular matrix
of ones is one tensor-core instruction sequence instead. For 16-bit x the product is exact
term by term (each term x_j * 1) and sums in fp32 like the scan (in another order); an fp32
x would be rounded to tf32 on the way in, so fp32 tiles always take the scan.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_prefix_sums(b_x, BR: tl.constexpr, BY_DOT: tl.constexpr):
    """[BR, BC] fp32 inclusive sums down the rows of b_x [BR, BC] (row i: x_0 + ... + x_i).
    BY_DOT with a 16-bit b_x: a product with the lower-triangular ones (BR >= 16); else, or
    for fp32 b_x, tl.cumsum on the tile in fp32."""
    if BY_DOT and b_x.dtype != tl.float32:
        o_r = tl.arange(0, BR)
        b_ones = (o_r[:, None] >= o_r[None, :]).to(b_x.dtype)
        return tl.dot(b_ones, b_x)
    return tl.cumsum(b_x.to(tl.float32), axis=0)
