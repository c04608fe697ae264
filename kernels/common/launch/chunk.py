"""Launch settings of the chunk pipeline of linear_attention and gated_linear_attention
(ChunkLaunch, one field per kernel)."""

from __future__ import annotations

import dataclasses
from typing import Any

from kernels.common.launch.base import KernelLaunch, SequentialLaunch, TileLaunch, check_pow2


@dataclasses.dataclass(frozen=True)
class FusedForwardLaunch(SequentialLaunch):
    """The linear/GLA forward's states and outputs in one sequential pass
    (kernels/gated_linear_attention/triton_fused_forward.py), used when enabled, K <= 128 and
    B * H >= min_heads; below min_heads, segment_programs > 0 cuts each sequence into
    segments run in parallel until about that many programs run (0: the two-kernel
    forward there). narrow_num_stages (0: num_stages) is the pipeline depth at head dims up to
    narrow_max_K. decay_on_v: for a scalar gate, each token's decay into the state multiplies
    its row of the [BT, BV] value tile rather than its column of the [BK, BT] key tile (K / BV
    times fewer multiplies in the sequential loop, and in the segments' local states); in the
    fused pass at head dims up to narrow_max_K only with narrow_decay_on_v (`decay_on_v_for`)."""

    enabled: bool = True
    min_heads: int = 64
    segment_programs: int = 0
    narrow_num_stages: int = 0
    narrow_max_K: int = 64
    decay_on_v: bool = False
    narrow_decay_on_v: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.narrow_num_stages < 0:
            raise ValueError(f"FusedForwardLaunch.narrow_num_stages must be >= 0 (0: num_stages), "
                             f"got {self.narrow_num_stages!r}")

    def stages_for(self, K: int) -> int:
        """num_stages at key width K: narrow_num_stages up to narrow_max_K where it is set (> 0)."""
        return self.narrow_num_stages if self.narrow_num_stages and K <= self.narrow_max_K else self.num_stages

    def decay_on_v_for(self, K: int) -> bool:
        """Whether the fused pass at key width K puts a scalar gate's decay on the value rows."""
        return self.decay_on_v and (K > self.narrow_max_K or self.narrow_decay_on_v)


@dataclasses.dataclass(frozen=True)
class IntraALaunch(KernelLaunch):
    """The vector-gate intra-chunk matrix (gated_linear_attention/triton_vector.py):
    sub_chunk rows per sub-chunk of its sub-chunk paths (a power of two, at most the chunk)."""

    BK: int = 128
    sub_chunk: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pow2(self, "BK")
        check_pow2(self, "sub_chunk", (1, 2, 4, 8, 16, 32, 64, 128))


@dataclasses.dataclass(frozen=True)
class PathLaunch(KernelLaunch):
    """One path's launch of the vector-gate dq/dk/dg kernel when the paths run apart.
    inter_after: the inter-chunk sums over V after the intra-chunk ones (fewer live registers
    in the intra part, a second pass over V)."""

    inter_after: bool = False


@dataclasses.dataclass(frozen=True)
class DqkgLaunch(TileLaunch):
    """The vector-gate dq/dk/dg kernel (gated_linear_attention/triton_vector.py).
    split_paths: one launch per path (whole chunk factored with these settings, sub-chunks
    factored with bwd_dqkg_sub's, exact with bwd_dqkg_exact's); False: one launch choosing
    per chunk. sub_chunk, inter_after: as in IntraALaunch and PathLaunch."""

    split_paths: bool = True
    sub_chunk: int = 8
    inter_after: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pow2(self, "sub_chunk", (1, 2, 4, 8, 16, 32, 64, 128))


def _fused(**kw: Any) -> FusedForwardLaunch:
    return FusedForwardLaunch(**kw)


@dataclasses.dataclass(frozen=True)
class DqkLaunch(TileLaunch):
    """The ungated / scalar-gate dq, dk (and dg) kernel (gated_linear_attention/triton_grad_qk.py).
    fuse_dv: where one K-block holds the whole key width (K <= BK), the kernel forms dv as well,
    from the q and k tiles it holds, in a second pass over dO and dS', and chunk_bwd_dv is not
    launched."""

    fuse_dv: bool = False


@dataclasses.dataclass(frozen=True)
class ChunkLaunch:
    """Launch settings of the chunk pipeline of linear_attention and gated_linear_attention
    (kernels/gated_linear_attention/triton_*.py). The fused forward and
    the state passes have one entry per gate mode where their best settings differ."""

    # fused forward, ungated: 0.46 ms vs 0.68 for two kernels at B * H = 512 (T = 2048), but
    # slower at B * H = 32 (T = 32768) unless cut into segments (0.78 -> 0.67 ms in 16)
    fwd_fused: FusedForwardLaunch = _fused(enabled=True, min_heads=64, segment_programs=1056, BK=128, BV=64,
                                           min_BV=16, min_waves=2, num_warps=4, num_stages=2)
    # scalar gate: the fused pass loses below B * H = 256; 3 segments are the fastest at 128
    fwd_fused_scalar: FusedForwardLaunch = _fused(enabled=True, min_heads=256, segment_programs=792, BK=128, BV=64,
                                                  min_BV=16, min_waves=2, num_warps=4, num_stages=2)
    # vector gate: BV 128 with 8 warps; its segments lose at T = 8192, so none
    fwd_fused_vector: FusedForwardLaunch = _fused(enabled=True, min_heads=256, segment_programs=0, BK=128, BV=128,
                                                  min_BV=16, min_waves=2, num_warps=8, num_stages=2)
    fwd_states: SequentialLaunch = SequentialLaunch(BK=128, BV=64, min_BV=32, min_waves=2, num_warps=4, num_stages=3)
    bwd_states: SequentialLaunch = SequentialLaunch(BK=128, BV=64, min_BV=32, min_waves=2, num_warps=4, num_stages=3)
    # a vector gate's passes are slower with 3 stages
    fwd_states_vector: SequentialLaunch = SequentialLaunch(BK=64, BV=64, min_BV=32, min_waves=2, num_warps=4,
                                                           num_stages=2)
    bwd_states_vector: SequentialLaunch = SequentialLaunch(BK=64, BV=64, min_BV=32, min_waves=2, num_warps=4,
                                                           num_stages=2)
    # BV 128: one program per chunk computes the intra-chunk matrix once
    fwd_output: TileLaunch = TileLaunch(BK=64, BV=128, num_warps=4, num_stages=2)
    bwd_dv: TileLaunch = TileLaunch(BK=64, BV=128, num_warps=4, num_stages=2)
    bwd_dqk: DqkLaunch = DqkLaunch(BK=64, BV=64, num_warps=4, num_stages=2, fuse_dv=False)
    # the whole K in one tile; 8-row sub-chunks halve the exact path's element-wise work
    intra_A: IntraALaunch = IntraALaunch(BK=128, sub_chunk=8, num_warps=4, num_stages=1)
    bwd_dqkg: DqkgLaunch = DqkgLaunch(BK=64, BV=64, split_paths=True, sub_chunk=8, inter_after=False, num_warps=4,
                                      num_stages=1)
    # 8 warps: at 4 the sub-chunk path spills registers (tests/compile_sm90.py --resources)
    bwd_dqkg_sub: PathLaunch = PathLaunch(num_warps=8, num_stages=1, inter_after=False)
    bwd_dqkg_exact: PathLaunch = PathLaunch(num_warps=8, num_stages=1, inter_after=False)
