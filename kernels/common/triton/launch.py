"""Launch settings of the shared chunk kernels (states, output, dq/dk) and of the GLA
vector-gate kernels, in one place.

Each entry holds the tile caps (BK over keys, BV over values: powers of two, capped by the
next power of two of the real dimension, at least 16), num_warps and num_stages. Defaults
are the settings first measured on one H200 at K = V = 128 (results/bench/h200_linear_gla.json);
benchmarks override entries to time alternatives (benchmarks/bench_linear_gla.py --variants).

The two sequential state passes ("fwd_states", "bwd_states") walk every chunk of a sequence in
one program, so with few sequences (B * H small, T long) they halve their V-block, down to
min_BV, while the grid would fill fewer than min_waves waves of the GPU's multiprocessors.
"""

from __future__ import annotations

import torch
import triton

from kernels.common.triton.utils import block_size, sequential_block_v

LAUNCH: dict[str, dict[str, int]] = {
    # fwd_fused (fused_forward.py; ungated, with _scalar / _vector entries for gated ops):
    # the forward's states and outputs in one sequential pass, used when enabled, K <= 128
    # and B * H >= min_heads; else fwd_states + fwd_output.
    # H200 (results/bench/h200_linear_gla_tune.json, fused_search), linear forward: 0.46 ms
    # fused vs 0.68 two kernels at B * H = 512 (T = 2048), 0.61 at 128 (T = 8192), but 0.98 vs
    # 0.78 at 32 (T = 32768), where the fused chunks run one after another in too few programs.
    # Gated, the fused pass lost already at 128 (scalar gate, T = 8192: 0.90 ms op forward vs
    # 0.76 for the two kernels), so gates need 256
    # segment_programs > 0: below min_heads, cut each sequence into segments run in parallel
    # (fused_forward.py) until about that many programs run; 0: the two-kernel forward there.
    # H200, op-level forward kernels at T = 32768 (B * H = 32; tune record "segments"):
    # linear 0.78 ms (two kernels) -> 0.67 fused in 16 segments (1056 programs); scalar gate
    # 0.92 -> 0.83; at T = 8192 (B * H = 128) scalar 0.80 -> 0.78-0.82 (2-4 segments). A
    # vector gate's segments lost at T = 8192 (1.25 vs 0.93) and won 5% at 32768: off there
    "fwd_fused": {"enabled": 1, "min_heads": 64, "segment_programs": 1056, "BK": 128,
                  "BV": 64, "min_BV": 16, "min_waves": 2, "num_warps": 4, "num_stages": 2},
    # scalar gate at T = 8192 (B * H = 128), fused kernel medians (session 6): 0.799 ms at
    # 1056 programs (4 segments), 0.770 at 792 (3), 0.865 at 528 (2), 0.850 unsegmented
    "fwd_fused_scalar": {"enabled": 1, "min_heads": 256, "segment_programs": 792, "BK": 128,
                         "BV": 64, "min_BV": 16, "min_waves": 2, "num_warps": 4, "num_stages": 2},
    # a vector gate: BV 128 and 8 warps, 0.80 ms at T = 2048 (1.02 at BV 64 / 4 warps); at
    # T = 8192 (128) the op forward took 2.66 ms fused against 1.96 at T = 32768 unfused
    "fwd_fused_vector": {"enabled": 1, "min_heads": 256, "segment_programs": 0, "BK": 128, "BV": 128,
                         "min_BV": 16, "min_waves": 2, "num_warps": 8, "num_stages": 2},
    # H200, T = 32768 (B = 2), linear: 0.571 ms at BK 64 / BV down to 16 / 2 stages -> 0.376 here;
    # the same at T = 2048: 0.318 -> 0.300 (results/bench/h200_linear_gla_tune.json)
    "fwd_states": {"BK": 128, "BV": 64, "min_BV": 32, "min_waves": 2, "num_warps": 4, "num_stages": 3},
    "bwd_states": {"BK": 128, "BV": 64, "min_BV": 32, "min_waves": 2, "num_warps": 4, "num_stages": 3},
    # a vector gate's passes were slower with 3 stages at T = 2048 (0.44 -> 0.55 ms backward):
    # BK 64 / BV down to 32 / 2 stages was best at both lengths
    "fwd_states_vector": {"BK": 64, "BV": 64, "min_BV": 32, "min_waves": 2, "num_warps": 4, "num_stages": 2},
    "bwd_states_vector": {"BK": 64, "BV": 64, "min_BV": 32, "min_waves": 2, "num_warps": 4, "num_stages": 2},
    # BV 128 (one program per chunk computes A once): 0.40 vs 0.41 ms (linear), 0.42 vs 0.53 (bwd_dv, scalar)
    "fwd_output": {"BK": 64, "BV": 128, "num_warps": 4, "num_stages": 2},
    "bwd_dv": {"BK": 64, "BV": 128, "num_warps": 4, "num_stages": 2},
    "bwd_dqk": {"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 2},
    # vector gate: intra_A with the whole K in one tile 0.44 -> 0.33 ms; bwd_dqkg at 4 warps
    # 2.34 -> 1.94 ms on mild gates (the factored path), 8.9 -> 11.5 on very negative ones
    # sub_chunk: rows per sub-chunk of the two sub-chunk paths (factored, exact); 8 halves
    # the exact path's element-by-element work for twice the (masked, full-chunk) dots. H200,
    # T = 8192 (B = 8), kernel medians, mild / -2-nat gates (tune record): session 5, on the
    # whole-chunk / exact paths, intra_A 0.336 / 2.052 ms at 16 -> 0.326 / 1.406 at 8;
    # session 6, whole-chunk / sub-chunk factored paths, 0.323 / 0.678 (8 warps: 0.479 /
    # 0.942; 16-row sub-chunks, where 17% of the -2-nat chunks then need the exact path:
    # 0.343 / 0.795)
    "intra_A": {"BK": 128, "num_warps": 4, "num_stages": 1, "sub_chunk": 8},
    # split_paths 1: one launch per path of triton_vector.py (whole chunk factored, sub-chunks
    # factored, exact), the latter two with bwd_dqkg_sub's / bwd_dqkg_exact's warps; 0: one
    # launch taking every path. Session 5 (H200, T = 8192, B = 8), whole-chunk and exact
    # paths only, bwd_dqkg mild / strong gates: one launch 1.951 / 11.567 ms; split 2.372 /
    # 9.125; split with 8-row sub-chunks 2.370 / 7.527. Session 6, three paths, mild / -2-nat
    # gates (sub-chunk path): 2.751 / 6.127 (chunk path at 8 warps 2.886 / 6.340; sub path
    # with inter_after 6.269); before dG took the rounded operands (call 1) one launch cost
    # 2.878 / 10.924 and 16-row sub-chunks 2.999 / 4.775 (9% of chunks exact)
    "bwd_dqkg": {"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 1, "split_paths": 1, "sub_chunk": 8,
                 "inter_after": 0},
    # 8 warps: at 4 the sub-chunk path spills (tests/compile_sm90.py --resources, Triton 3.9)
    "bwd_dqkg_sub": {"num_warps": 8, "num_stages": 1, "inter_after": 0},
    "bwd_dqkg_exact": {"num_warps": 8, "num_stages": 1, "inter_after": 0},
}


# the fused forward's entries, indexed by gate mode (GATE_NONE, GATE_SCALAR, GATE_VECTOR = 0, 1, 2)
FUSED_FORWARD_ENTRIES = ("fwd_fused", "fwd_fused_scalar", "fwd_fused_vector")


def sequential_blocks(kernel: str, K: int, V: int, n_heads: int, device: torch.device) -> tuple[int, int]:
    """(BK, BV) of a sequential state pass: LAUNCH[kernel]'s caps, BV halved (to min_BV)
    while n_heads * K-blocks * V-blocks programs fill fewer than min_waves waves."""
    cfg = LAUNCH[kernel]
    BK = block_size(K, cfg["BK"])
    BV = sequential_block_v(V, cfg["BV"], cfg["min_BV"], cfg["min_waves"], n_heads * triton.cdiv(K, BK), device)
    return BK, BV
