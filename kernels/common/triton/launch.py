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

LAUNCH: dict[str, dict[str, int]] = {
    "fwd_states": {"BK": 64, "BV": 64, "min_BV": 16, "min_waves": 2, "num_warps": 4, "num_stages": 2},
    "bwd_states": {"BK": 64, "BV": 64, "min_BV": 16, "min_waves": 2, "num_warps": 4, "num_stages": 2},
    "fwd_output": {"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 2},
    "bwd_dv": {"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 2},
    "bwd_dqk": {"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 2},
    "intra_A": {"BK": 64, "num_warps": 4, "num_stages": 1},
    "bwd_dqkg": {"BK": 64, "BV": 64, "num_warps": 8, "num_stages": 1},
}


def tile(dim: int, cap: int) -> int:
    """Tile width for a dimension: next power of two, at least 16 (tl.dot), at most cap."""
    return max(16, min(cap, triton.next_power_of_2(dim)))


def sequential_blocks(kernel: str, K: int, V: int, n_heads: int, device: torch.device) -> tuple[int, int]:
    """(BK, BV) of a sequential state pass: LAUNCH[kernel]'s caps, BV halved (to min_BV)
    while n_heads * K-blocks * V-blocks programs fill fewer than min_waves waves."""
    cfg = LAUNCH[kernel]
    BK, BV = tile(K, cfg["BK"]), tile(V, cfg["BV"])
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        floor = max(16, cfg["min_BV"])
        while BV > floor and n_heads * triton.cdiv(K, BK) * triton.cdiv(V, BV) < cfg["min_waves"] * sms:
            BV //= 2
    return BK, BV
