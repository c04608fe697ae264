"""Triton building blocks shared by the chunkwise kernels of the linear-attention family.

Every kernel here works on the FLA layout (q, k: [B, T, H, K]; v: [B, T, H, V]) split into
chunks of BT tokens (docs/design.md §10), and on cumulative log-gates in log2 units (so kernels
use exp2): gamma = chunk_local_cumsum(g, BT, scale=LOG2E).

    utils.py     buffers (NaN-poisoned on request), block sizes, gate modes, dot precision
    cumsum.py    chunk-local (reverse) cumulative sum of log-gates, scalar or vector
    states.py    state passing across chunks: forward (h per chunk) and backward (dh per chunk)
    output.py    o = (Q e^gamma) S + A V per chunk, and dv = A^T dO + (K e^(gamma_C-gamma)) dS'
    grad_qk.py   dq, dk (and the per-token gate gradient) for ungated / scalar-gated chunks
    fused_forward.py  states and outputs in one sequential pass (many heads, K <= 128)
    launch.py    tile widths, warps and stages of the kernels above, in one table
    step.py      fused one-token decode step (linear, GLA, delta rule, gated delta rule)
    tiles.py, solve.py  masked tile loads/stores; the chunk's triangular solve (delta rules)

Importing this package imports triton: callers import it lazily (triton is optional).
"""
