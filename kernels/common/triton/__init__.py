"""The Triton toolkit: building blocks shared by the chunkwise kernels of every op.

Every kernel here works on the FLA layout (q, k: [B, T, H, K]; v: [B, T, H, V]) split into
chunks of BT tokens (docs/design.md §10), and on cumulative log-gates in log2 units (so kernels
use exp2): gamma = chunk_local_cumsum(g, BT, scale=LOG2E).

    tiles.py     the tile library: masked tile / vector loads and stores, every kernel's
    gates.py     the gate unit: LOG2E, the gate floor, gate modes, causal decay masks
    utils.py     buffers (NaN-poisoned on request), tile widths, dot precision, chunk sizes,
                 the sequential passes' V-block narrowing
    cumsum.py    chunk-local (reverse) cumulative sum of log-gates, scalar or vector
    step.py      fused one-token decode step (linear, GLA, delta rule, gated delta rule)
    solve.py     the chunk's triangular solve (delta rules)

Launch settings (tile caps, warps, stages, switches) are frozen objects in
kernels/common/launch/, read through launch.settings(op) where a kernel is launched.

Importing this package imports triton: callers import it lazily (triton is optional).
"""
