"""Chunk-local cumulative sum of log-gates (docs/design.md §10: gamma_i = g_1 + ... + g_i in a chunk).

    chunk_local_cumsum(g, chunk_size, scale=LOG2E, reverse=False) -> fp32, same shape as g

g: [B, T, H] (scalar gate) or [B, T, H, D] (vector gate). The sum restarts at every chunk
of `chunk_size` tokens; the last chunk may be partial. `scale` multiplies the result
(LOG2E turns natural-log gates into log2 units for exp2 in the kernels); reverse=True sums
from the end of each chunk (gamma_i = g_i + ... + g_last).

The sum runs in fp64 and is rounded to fp32 once, so every stored gamma is within half an
ulp of the chunk's exact sum whatever order the scan adds in. The kernels' decays are
exp2(gamma_i - gamma_j), and a near pair's decay is close to 1 while gamma_i and gamma_j may
be hundreds (strong gates): an fp32 scan would add the rounding of every partial sum on its
tree's path to each, where one rounding of the result is all fp32 storage needs
(tests/kernels/triton/test_cumsum_triton.py: 2-4 ulps on the interpreter's fp32 scan).
The scan costs about a dozen fp64 adds per element: next to the memory traffic on an H100 or
H200 (fp64 at half fp32's rate), not on GPUs whose fp64 runs at 1/64 (the vector gate's
[B, T, H, K] sums, there).

Gates below GATE_FLOOR_LOG2 / scale (gates.py: a decay of 2^-80 in one token) are raised to
it first, so the sums stay finite for g = -inf (a full reset, which the op contract allows)
and every difference of two of them, the kernels' exp2(gamma_i - gamma_j), is a number:
-inf - (-inf) would be NaN. Gates above the floor are summed as they are.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.common.triton.gates import GATE_FLOOR_C, LOG2E
from kernels.common.triton.tiles import load_tile, store_tile
from kernels.common.triton.utils import new_buffer

# columns a program scans side by side: a [64, 64] fp64 tile is 32 values a thread at 4 warps
MAX_COLUMNS = 64


@triton.jit
def chunk_local_cumsum_kernel(
    g, out, scale, T,
    C: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, REVERSE: tl.constexpr,
):
    # g viewed as [B, T, C] (C = H, or H * D for a vector gate): a program scans one [BT, BC]
    # tile down its rows, neighbouring heads' columns side by side, so it loads and stores runs
    # of contiguous memory rather than one strided value a row
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq = i_b.to(tl.int64) * T * C
    floor = GATE_FLOOR_C / scale  # in g's units: gates at or above it are summed exactly as they are
    b_g = load_tile(g + seq, i_t * BT, i_c * BC, T, C, C, BT, BC).to(tl.float32)
    b_o = tl.cumsum(tl.maximum(b_g, floor).to(tl.float64), axis=0, reverse=REVERSE) * scale
    store_tile(out + seq, b_o.to(tl.float32), i_t * BT, i_c * BC, T, C, C, BT, BC)


def chunk_local_cumsum(
    g: torch.Tensor, chunk_size: int, scale: float = LOG2E, reverse: bool = False
) -> torch.Tensor:
    """Cumulative sum of g within each chunk of `chunk_size` tokens, times `scale`.

    g: [B, T, H] or [B, T, H, D], any float dtype, contiguous. Returns fp32 of g's shape.
    Zero padding past T is neutral, so a partial last chunk needs no special case. Gates
    below GATE_FLOOR_LOG2 / scale count as that floor (scale > 0).
    """
    B, T = g.shape[:2]
    C = math.prod(g.shape[2:])  # H, or H * D
    BC = min(triton.next_power_of_2(C), MAX_COLUMNS)
    out = new_buffer(tuple(g.shape), torch.float32, g.device)
    grid = (triton.cdiv(T, chunk_size), triton.cdiv(C, BC), B)
    chunk_local_cumsum_kernel[grid](g, out, scale, T, C=C, BT=chunk_size, BC=BC, REVERSE=reverse)
    return out
