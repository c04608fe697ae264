"""Launch settings of the delta-rule Triton kernels, in one place.

TUNING maps each kernel to its tile widths (BK over the key dimension, BV over the value
dimension; each is capped by the next power of two of the real dimension) and its
num_warps / num_stages. Values were chosen for Hopper (H200) at K = V = 128; benchmarks
may override entries to compare settings (benchmarks/bench_delta.py --tune / --variants).
Measured on one H200 (Triton 3.6, T = 8192, results/bench/h200_delta.json): num_warps=8 for
wy_fwd / dqkw / wy_bwd made each 1.6-1.8x slower; wy_bwd at num_warps=2 1.8x slower;
num_stages=3 for the sequential kernels and num_stages=1 for dqkw slower too. "seq_BV" is the V-block of the two kernels that
walk the chunks in order: narrower blocks give more programs when there are few sequences.

Hopper notes: num_warps=8 is avoided (flash-linear-attention saw miscompiles there with
Triton 3.4 to 3.7), and no kernel feeds tl.trans of a dot result into another dot.
"""

from __future__ import annotations

CHUNK = 64  # tokens per chunk: the WY solve (kernels/common/triton/solve.py) is written for 64

TUNING: dict[str, dict[str, int]] = {
    # tf32_solve: 1 = the chunk inverse for 16-bit inputs on tensor cores (tf32), 0 = true fp32.
    # H200, T = 8192, bf16: 1.54 ms (4 warps, fp32 solve) -> 1.20 (tf32) / 1.16 (2 warps) ->
    # 0.78 (both) -> 0.55 (and num_stages 2); the output moves by 2.5e-3 relative (bf16
    # rounding is 4e-3).
    "wy_fwd": {"BK": 64, "BV": 64, "num_warps": 2, "num_stages": 2, "tf32_solve": 1},
    "state_fwd": {"BV": 64, "num_warps": 4, "num_stages": 2},
    # state_fwd with the output fused (triton_fwd.py), from min_heads = B * H on; off until
    # timed on a GPU (the linear-attention analogue won at B * H >= 64 on the H200)
    "fused_fwd": {"enabled": 0, "min_heads": 64, "BV": 64, "num_warps": 4, "num_stages": 2},
    "output_fwd": {"BK": 128, "BV": 128, "num_warps": 4, "num_stages": 2},
    "du_local": {"BK": 128, "BV": 128, "num_warps": 4, "num_stages": 2},
    "state_bwd": {"BV": 64, "num_warps": 4, "num_stages": 2},
    "dqkw": {"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 2},
    "wy_bwd": {"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 1},
    # the sequential kernels halve their V-block (down to min_BV) while heads x V-blocks
    # would fill fewer than min_waves waves of the GPU's multiprocessors
    "seq": {"min_BV": 32, "min_waves": 2},
}
