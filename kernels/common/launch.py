"""Launch settings of the Triton kernels: frozen typed objects, one per kernel, one per op.

Each Triton kernel has a frozen dataclass of what its launch takes besides the tensors:
tile caps (BK over keys, BV over values: powers of two, capped by the next power of two of
the real dimension, at least 16), num_warps, num_stages and the kernel's own switches. An
op's settings object groups its kernels' objects (ChunkLaunch for linear_attention and
gated_linear_attention, DeltaLaunch for delta_rule and gated_delta_rule, MesaLaunch,
LinGdnLaunch); DEFAULTS holds one per op, and nothing here is ever changed in place.

    settings("gated_delta_rule").wy_fwd.num_warps              # the settings in effect
    with launch_settings(gated_delta_rule={"fused_fwd": {"enabled": True, "min_heads": 1}}):
        ...                                                     # overridden inside the block
    settings_in_effect(["gated_delta_rule"])                   # as a JSON-able dict

launch_settings keeps its overrides in a context variable, so they hold for the code inside
the block (and in the same thread) only, and nest. Autograd may run a backward on another
thread, where the variable holds its defaults: the Triton ops therefore read their settings
when the forward runs and hand them to their backward explicitly (encode / decode).

Runs record what their Triton ops used: within `recording_launches()`, each op's forward
calls note_launch(op) and the settings it ran with land in the yielded dict, which the
runner writes into the run record's `launch` field.

The defaults were measured on one H200 at K = V = 128 (2026-11-29, before the kernels task:
`git show 4509c5c:results/bench/<h200_linear_gla,h200_linear_gla_tune,h200_delta,h200_mesa>.json`);
the kernels task times alternatives under launch_settings (its `launch` field, a sweep's
`vary`: configs/kernels-launch.yaml). This module imports neither torch nor triton.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

TILE_WIDTHS = (16, 32, 64, 128, 256)
GRID_YZ_MAX = 65535  # CUDA's limit on a grid's second and third axes
FP32_DOTS = ("ieee", "tf32x3")  # KernelLaunch.fp32_dots


def _check_pow2(owner: object, name: str, allowed: tuple[int, ...] = TILE_WIDTHS) -> None:
    value = getattr(owner, name)
    if value not in allowed:
        raise ValueError(f"{type(owner).__name__}.{name} must be one of {list(allowed)}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class KernelLaunch:
    """num_warps and num_stages of one kernel's launch (the interpreter runs 1 warp whatever
    num_warps says: kernels/common/triton/utils.warps), and fp32_dots: the precision of the
    dots that would otherwise take true fp32 products ("ieee": fp32 inputs under torch's
    "highest" float32 matmul precision, and the delta rules' chunk inverse), one of
    FP32_DOTS. Triton lowers "ieee" dots to scalar FMAs, off the tensor cores; "tf32x3" splits
    each operand into two TF32 parts and sums three tensor-core products, close to fp32's
    rounding (a candidate for the default once timed and held to the fp32 bounds on a GPU)."""

    num_warps: int = 4
    num_stages: int = 2
    fp32_dots: str = "ieee"

    def __post_init__(self) -> None:
        _check_pow2(self, "num_warps", (1, 2, 4, 8, 16, 32))
        if self.num_stages < 1:
            raise ValueError(f"{type(self).__name__}.num_stages must be >= 1, got {self.num_stages!r}")
        if self.fp32_dots not in FP32_DOTS:
            raise ValueError(f"{type(self).__name__}.fp32_dots must be one of {list(FP32_DOTS)}, got {self.fp32_dots!r}")


@dataclasses.dataclass(frozen=True)
class TileLaunch(KernelLaunch):
    """A kernel tiled over keys (BK) and values (BV)."""

    BK: int = 64
    BV: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_pow2(self, "BK")
        _check_pow2(self, "BV")


@dataclasses.dataclass(frozen=True)
class SequentialLaunch(TileLaunch):
    """A state pass that walks a sequence's chunks in order in one program: with few
    sequences it halves BV, down to min_BV, while the grid would fill fewer than min_waves
    waves of the GPU's multiprocessors (kernels/common/triton/utils.sequential_block_v)."""

    min_BV: int = 32
    min_waves: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_pow2(self, "min_BV")


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
        _check_pow2(self, "BK")
        _check_pow2(self, "sub_chunk", (1, 2, 4, 8, 16, 32, 64, 128))


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
        _check_pow2(self, "sub_chunk", (1, 2, 4, 8, 16, 32, 64, 128))


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


@dataclasses.dataclass(frozen=True)
class WyFwdLaunch(TileLaunch):
    """The delta rules' per-chunk WY preparation. tf32_solve: the chunk inverse of 16-bit
    inputs on tf32 tensor cores (the inverse is rounded to 16 bits anyway); False: true fp32."""

    tf32_solve: bool = True


@dataclasses.dataclass(frozen=True)
class StatePassLaunch(KernelLaunch):
    """A delta-rule state pass (the whole K in registers, V in blocks of at most BV).
    few_program_stages (0: num_stages everywhere): pipeline stages where the grid's programs
    fill at most few_program_waves waves of the GPU (one program per multiprocessor a wave):
    each program then walks its chunks with its SM nearly to itself, and a deeper pipeline
    hides the loads that other programs would hide otherwise."""

    BV: int = 64
    few_program_stages: int = 0
    few_program_waves: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_pow2(self, "BV")
        if self.few_program_stages < 0 or self.few_program_waves < 1:
            raise ValueError(f"{type(self).__name__}.few_program_stages must be >= 0 (0: off) and few_program_waves "
                             f">= 1, got {self.few_program_stages!r} and {self.few_program_waves!r}")

    def stages_for(self, BK: int, element_size: int, stages: int | None = None) -> int:
        """num_stages (or `stages`) of a pass whose K-block is BK wide over elements of
        element_size bytes: one stage from 1 KB rows on (fp32 at K = 256), where two stages of
        its [chunk, BK] tiles ask for more shared memory than a Hopper SM has (state_bwd: 336 of
        227 KB), and at most two from 512 B rows on (16-bit at K = 256), which three would
        overflow too."""
        stages = self.num_stages if stages is None else stages
        row = BK * element_size
        return 1 if row >= 1024 else min(stages, 2) if row >= 512 else stages

    def stages_at(self, BK: int, element_size: int, programs: int, multiprocessors: int | None) -> int:
        """stages_for a grid of `programs` on a GPU of `multiprocessors` (None: not a GPU, where
        stages do not apply): few_program_stages where the programs fill at most
        few_program_waves waves, else num_stages."""
        few = (self.few_program_stages and multiprocessors is not None
               and programs <= self.few_program_waves * multiprocessors)
        return self.stages_for(BK, element_size, self.few_program_stages if few else None)


@dataclasses.dataclass(frozen=True)
class StateBwdLaunch(StatePassLaunch):
    """The delta rules' backward state pass. local_du: from min_heads = B * H on and for head
    dims K <= max_K, the pass forms the intra-chunk dU_local = P^T dO itself from the q, k and
    dO tiles it loads anyway (one [BT, K] x [K, BT] and one [BT, BT] x [BT, BV] product more
    per chunk, on every V-block), and the du_local kernel, which reads q, k and dO and writes
    dU_local, is not run. factors_on_v: the per-row factors of each chunk's products (the scale
    and the gate's 2^gamma of Q^T dO, the gate's 2^(gamma_C - gamma) of Kd dS) multiply the
    [BT, BV] dO tile and product rather than the [BT, K] q and k tiles: K / BV times fewer
    multiplies in the sequential loop (the second one after its product, on the loop's
    dependency chain). Not where the pass forms dU_local, which needs dO unscaled too: there it
    timed slower (GDN, K = 64: 570 / 574 / 935 -> 598 / 604 / 1,014 us at T = 2k / 8k / 32k;
    one H100, records 20261207T080540, T080553)."""

    local_du: bool = False
    min_heads: int = 128
    max_K: int = 256
    factors_on_v: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_K < 16:
            raise ValueError(f"StateBwdLaunch.max_K must be >= 16, got {self.max_K!r}")


@dataclasses.dataclass(frozen=True)
class FusedStateLaunch(StatePassLaunch):
    """The delta-rule forward state pass with the output fused, from min_heads = B * H on;
    max_state (0: no cap) caps the state block a program holds, K x BV entries, by narrowing
    BV (down to 16)."""

    enabled: bool = False
    min_heads: int = 64
    max_state: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_state and (self.max_state < 256 or self.max_state & (self.max_state - 1)):
            raise ValueError(f"FusedStateLaunch.max_state must be 0 (no cap) or a power of two >= 256, "
                             f"got {self.max_state!r}")

    def block_v(self, K: int) -> int:
        """The V-block cap at head dim K (a power of two)."""
        return min(self.BV, max(16, self.max_state // K)) if self.max_state else self.BV


@dataclasses.dataclass(frozen=True)
class NarrowingLaunch:
    """How the delta rules' sequential passes narrow their V-block: halved, down to min_BV,
    while heads x V-blocks would fill fewer than min_waves waves of the GPU."""

    min_BV: int = 32
    min_waves: int = 2

    def __post_init__(self) -> None:
        _check_pow2(self, "min_BV")


@dataclasses.dataclass(frozen=True)
class NarrowVLaunch(TileLaunch):
    """A delta-rule tile kernel whose warps drop to narrow_num_warps where its V-block is under
    64 columns. On the H200 (Triton 3.6, bf16) 4 warps at V-blocks of 16 and 32 miscompile:
    wy_bwd's dv and dbeta (rel. err. 0.9; dk and dg through them), and output_fwd's o and
    du_local's dU at K = 128 (tests/gpu/test_delta_stages_gpu.py); wy_bwd is right with 2
    warps, and every kernel is right with 4 at V-blocks of 64 and 128."""

    narrow_num_warps: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_pow2(self, "narrow_num_warps", (1, 2, 4, 8, 16, 32))

    def warps_for(self, BV: int) -> int:
        """num_warps of a launch whose V-block is BV wide."""
        return self.narrow_num_warps if BV < 64 else self.num_warps


@dataclasses.dataclass(frozen=True)
class WyBwdLaunch(NarrowVLaunch):
    """The delta rules' WY backward (kernels/gated_delta_rule/triton_wy_bwd.py). dm_readback:
    dM^T read back transposed from a per-chunk copy of dM in global memory (a [BT, BT] tile in
    the input dtype a chunk, in a scratch buffer) instead of formed again as -Tm dTm^T Tm from
    transposed products of k, dW, v and dU: a quarter of the kernel's products and its second
    pass over K and V go (a product is never transposed in registers: solve.py says why). The
    same for dqkw's (dP ⊙ Gamma)^T was slower (1,422 -> 1,527 us at 2k, K = 128, one H100,
    record 20261207T024336) and is not built."""

    dm_readback: bool = True


@dataclasses.dataclass(frozen=True)
class DqkwLaunch(TileLaunch):
    """The delta rules' dq/dk/dW kernel (kernels/gated_delta_rule/triton_bwd_grad.py).
    dk_part_16bit: for 16-bit inputs, dk's share from the output and the state (which wy_bwd
    completes with the WY part) is stored in the input dtype instead of fp32, halving what
    the kernel writes and wy_bwd reads of it ([B, T, H, K]); dk then carries one rounding
    more of that share (dg, which dqkw hands over apart in fp32, does not). narrow_BV (0: BV)
    is the V-block's cap at head dims up to narrow_max_K (block_v_for). k_loop: where K spans
    several K-blocks, one program a chunk walks them (dqkw_k_loop_kernel) instead of one
    program a K-block, so that each chunk's dP = dO U^T and its transpose are formed once
    rather than once per K-block. fuse_wy_bwd: where V >= 64, the k-loop form and the WY
    backward run as one kernel a chunk (kernels/gated_delta_rule/triton_bwd_fused.py), which
    reads back dW, dk's share and the d gamma shares its program has just written, and k and
    dU, which both halves read, from memory once; it runs at this launch's warps and stages.
    Both are off: on one H100 (records 20261207T184436-T185027, candidates 29-34) the k-loop
    dqkw was within 1 % of one program a K-block at K = 128 (1,505 against 1,490 us, GDN, T =
    2k) and slower over 32-key blocks (1,825), and the fused kernel 24 % slower than the two
    launches for GDN (3,150 against 2,541 us) and level for DeltaNet."""

    dk_part_16bit: bool = False
    narrow_BV: int = 0
    narrow_max_K: int = 64
    k_loop: bool = False
    fuse_wy_bwd: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_pow2(self, "narrow_BV", (0, *TILE_WIDTHS))

    def block_v_for(self, K: int) -> int:
        """The V-block cap of a launch at head dim K."""
        return self.narrow_BV if self.narrow_BV and K <= self.narrow_max_K else self.BV


@dataclasses.dataclass(frozen=True)
class DeltaLaunch:
    """Launch settings of the delta_rule / gated_delta_rule kernels (kernels/gated_delta_rule).
    num_warps 8 is avoided on Hopper (miscompiles seen with Triton 3.4 to 3.7) and measured
    1.6-1.8x slower for wy_fwd, dqkw and wy_bwd."""

    # 2 warps and the tf32 solve: 1.54 -> 0.55 ms at T = 8192, bf16; 3 stages: 560 / 583 / 596
    # -> 491 / 502 / 511 us at T = 2k / 8k / 32k, K = 128 (one H100, DeltaNet), unchanged at 64
    wy_fwd: WyFwdLaunch = WyFwdLaunch(BK=64, BV=64, num_warps=2, num_stages=3, tf32_solve=True)
    # 3 stages: 990 -> 656 us at 32k, K = 128, and 818 -> 559 at K = 64 (32 and 64 sequences
    # of heads, each program walking 512 chunks); 2k and 8k unchanged but K = 64 at 8k (489 -> 592)
    state_fwd: StatePassLaunch = StatePassLaunch(BV=64, num_warps=4, num_stages=3)
    # The training forward with the output fused into the state pass (h and U still stored),
    # from 256 sequences of heads (one H100, DeltaNet, against state_fwd + output_fwd): K = 128
    # 918 against 1,103 us at 2k (512 B * H) but 1,387 against 1,208 at 8k (128); K = 64 684 /
    # 840 against 914 / 935 at 2k / 8k (1,024 / 256); GDN K = 128 at 2k 1,201 against 1,148
    fused_fwd: FusedStateLaunch = FusedStateLaunch(enabled=True, min_heads=256, BV=64, num_warps=4, num_stages=2)
    # A forward no backward follows (no gradient wanted): the fused pass then stores no states.
    # One H100, T = 2k / 8k / 32k, K = 128: GDN 1.52 / 1.34 / 1.88 ms against 1.71 / 1.86 / 2.25
    # for the state pass then the output (DeltaNet 1.21 / 1.20 / 1.65 against 1.62 / 1.73 /
    # 2.08), at 8 warps 1.67 / 2.41 / 2.48; B * H from 32 to 512 (fewer heads: not yet timed).
    # A state block of at most 4,096 entries: BV 32 at K = 128 took GDN's pass at 2k from 976
    # to 752 us (DeltaNet 709 -> 682), where at K = 64 BV 32 was slower (473 -> 658).
    # Three stages where the programs fill at most two waves (B * H x V-blocks <= 264 on an
    # H100), two elsewhere; three everywhere (records 20261206T194547, T194558), GDN / DeltaNet
    # pass at K = 128: 128 programs (32k) 1,242 / 1,122 -> 964 / 718 us, 512 (8k) 748 / 676 ->
    # 969 / 702, 2,048 (2k) 753 / 681 -> 983 / 716; K = 64: 64 (32k) 1,207 / 925 -> 672 / 566,
    # 256 (8k) 703 / 610 -> 497 / 463, 1,024 (2k) 486 / 468 -> 483 / 474
    infer_fused: FusedStateLaunch = FusedStateLaunch(enabled=True, min_heads=32, BV=64, num_warps=4, num_stages=2,
                                                     max_state=4096, few_program_stages=3, few_program_waves=2)
    output_fwd: NarrowVLaunch = NarrowVLaunch(BK=128, BV=128, num_warps=4, num_stages=2, narrow_num_warps=2)
    du_local: NarrowVLaunch = NarrowVLaunch(BK=128, BV=128, num_warps=4, num_stages=2, narrow_num_warps=2)
    # dU_local formed in the backward state pass (no du_local launch). One H100, DeltaNet,
    # state_bwd + du_local against state_bwd alone: K = 128 1,465 / 1,399 / 1,858 -> 851 / 854
    # / 1,390 us at T = 2k / 8k / 32k, K = 64 993 / 1,232 / 1,615 -> 579 / 721 / 1,028. GDN
    # (DEFAULTS) takes it at K = 64 only: there 1,028 / 1,382 / 1,747 -> 582 / 750 / 1,201,
    # at K = 128 1,577 / 1,476 / 2,049 -> 1,504 / 1,971 / 1,941
    state_bwd: StateBwdLaunch = StateBwdLaunch(BV=64, num_warps=4, num_stages=2, local_du=True, min_heads=1)
    dqkw: DqkwLaunch = DqkwLaunch(BK=64, BV=64, num_warps=4, num_stages=2)
    # dM^T read back from a scratch copy: wy_bwd 1,138 / 1,156 / 1,184 -> 1,072 / 1,095 / 1,134
    # us (DeltaNet) and 1,245 / 1,327 / 1,390 -> 1,134 / 1,197 / 1,297 (GDN) at T = 2k / 8k / 32k,
    # K = 128; GDN at K = 64 1,557 / 1,694 / 1,926 -> 1,270 / 1,291 / 1,512 (one H100, records
    # 20261207T024308-T024402)
    wy_bwd: WyBwdLaunch = WyBwdLaunch(BK=64, BV=64, num_warps=4, num_stages=1, narrow_num_warps=2, dm_readback=True)
    seq: NarrowingLaunch = NarrowingLaunch(min_BV=32, min_waves=2)
    # The kernels parallel over chunks (wy_fwd, wy_bwd, dqkw, du_local, output_fwd) launch the
    # sequences of heads on the grid's faster axis rather than the chunks (heads_first: always;
    # heads_first_from_chunks: where a sequence has at least that many chunks, 0: never), so
    # that programs running together read neighbouring heads' columns of the same rows
    # ([B, T, H, D] keeps a row's heads side by side) instead of one head's columns over many
    # rows (DEFAULTS: both rules from 256 chunks on)
    heads_first: bool = False
    heads_first_from_chunks: int = 0
    # store_p: the training forward's output pass (the fused state pass, or output_fwd) also
    # stores each chunk's P = scale (Q K^T ⊙ Gamma) (lower, diagonal included), [B, T, H, 64] in
    # q's dtype, the same 16-bit P its output product reads, and the backward's dU_local = P^T dO
    # (in du_local, or in the state pass under StateBwdLaunch.local_du) loads P's transpose
    # instead of forming Q K^T from q and k: one [BT, K] x [K, BT] product and the decay's
    # exp2s fewer per V-block in the sequential pass, and q and k not read by du_local, for one
    # [B, T, H, 64] write in the forward (half a [B, T, H, 128] tensor)
    store_p: bool = False
    # p_in_wy: P is formed by wy_fwd, parallel over chunks (one [BT, K] x [K, BT] product more
    # there, and q read), stored for the backward as under store_p, and the output pass loads it
    # instead of forming it inside the state pass's sequential loop or in output_fwd (which then
    # reads no k); on, P is stored whatever store_p says
    p_in_wy: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.heads_first_from_chunks, int) or self.heads_first_from_chunks < 0:
            raise ValueError("DeltaLaunch.heads_first_from_chunks must be a count of chunks >= 0 (0: never), "
                             f"got {self.heads_first_from_chunks!r}")

    def keeps_p(self) -> bool:
        """Whether a training forward stores P for its backward (store_p or p_in_wy)."""
        return self.store_p or self.p_in_wy

    def heads_first_at(self, n_chunks: int) -> bool:
        """Whether the chunk-parallel kernels of a sequence of n_chunks chunks launch the heads
        on the grid's faster axis (chunk_grid). The rule by length leaves the chunks first
        past GRID_YZ_MAX chunks, which the slower axis could not hold (heads_first forces
        the order, and chunk_grid refuses such a grid)."""
        return self.heads_first or 0 < self.heads_first_from_chunks <= n_chunks <= GRID_YZ_MAX


SOLVE_OPERANDS = ("fp32", "fp16_scaled", "fp16_normed")
DOT_PRECISIONS = ("ieee", "tf32", "tf32x3")


@dataclasses.dataclass(frozen=True)
class SolveLaunch:
    """Launch settings of mesa's CG kernels (kernels/mesa/triton_solve.py).

    rows: rows (tokens) per program, the chunk or a fraction of it, narrow_rows (0: rows) at
    head dims up to narrow_max_K (rows_for); num_warps: on a GPU, narrow_num_warps at head dims
    up to narrow_max_K (warps_for);
    weights_scan: segment sums by a running sum instead of an fp32 FMA product
    (chunk_weights); diag_cg_prec: diag(M) (the Jacobi start only) at the CG loop's dot
    precision instead of fp32 FMAs (the same for fp32 inputs); operands: the CG mat-vecs'
    operands, "fp32" (tiles at the CG dot precision) or fp16 scaled per row, by its largest
    entry ("fp16_scaled", triton_system.matvec_half) or by a norm the CG loop carries
    ("fp16_normed", matvec_normed: no row reductions per mat-vec); the fp16 forms apply to
    16-bit inputs only (fp32 inputs keep true fp32 products)."""

    rows: int = 64
    narrow_rows: int = 0
    num_warps: int = 8
    narrow_num_warps: int = 4
    narrow_max_K: int = 64
    weights_scan: bool = False
    diag_cg_prec: bool = False
    operands: str = "fp32"

    def __post_init__(self) -> None:
        _check_pow2(self, "num_warps", (1, 2, 4, 8, 16, 32))
        _check_pow2(self, "narrow_num_warps", (1, 2, 4, 8, 16, 32))
        _check_pow2(self, "rows")
        _check_pow2(self, "narrow_rows", (0, *TILE_WIDTHS))
        if self.operands not in SOLVE_OPERANDS:
            raise ValueError(f"SolveLaunch.operands must be one of {SOLVE_OPERANDS}, got {self.operands!r}")

    def warps_for(self, BK: int) -> int:
        """num_warps of a program whose K-block is BK wide: narrow_num_warps up to narrow_max_K.
        Every CG program holds its tiles in about 255 registers a thread (sm_90 screen), so an
        8-warp program fills an SM's register file alone; where the tiles are small enough that
        per-step latency, not dot throughput, sets the time (K = 64), two 4-warp programs
        sharing an SM take half the time, and at K = 128 4 warps take twice as long (one H100,
        T = 2k, forward / backward solve: K = 64 7,828 / 14,684 -> 3,999 / 7,555 us; K = 128
        8,529 / 10,292 -> 15,749 / 25,638 us; records 20261206T194448 and T194514)."""
        return self.narrow_num_warps if BK <= self.narrow_max_K else self.num_warps

    def rows_for(self, BK: int) -> int:
        """Rows per program of a launch whose K-block is BK wide: narrow_rows (where set) up to
        narrow_max_K, rows above."""
        return self.narrow_rows if self.narrow_rows and BK <= self.narrow_max_K else self.rows


@dataclasses.dataclass(frozen=True)
class GradsLaunch(KernelLaunch):
    """Launch settings of mesa's gradient kernel (kernels/mesa/triton_grads.py). BC: key
    columns of dk per step (a power of two; capped at the whole K-block): below it the
    [K, K] state gradient is read in [K, BC] column blocks, never held whole."""

    BC: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_pow2(self, "BC")


@dataclasses.dataclass(frozen=True)
class StateLaunch:
    """Launch settings of mesa's state passes (kernels/mesa/triton_states.py).

    max_BK / max_BD: widest row / column block of a state (powers of two, 16 .. 128); the
    column block narrows down to min_BD while there would be fewer than min_programs
    programs per multiprocessor (each program walks every chunk in turn); num_warps,
    num_stages: on a GPU."""

    max_BK: int = 128
    max_BD: int = 64
    min_BD: int = 16
    min_programs: int = 2
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("max_BK", "max_BD", "min_BD"):
            _check_pow2(self, name, (16, 32, 64, 128))
        if self.min_BD > self.max_BD:
            raise ValueError(f"StateLaunch.min_BD ({self.min_BD}) exceeds max_BD ({self.max_BD})")


@dataclasses.dataclass(frozen=True)
class MesaLaunch:
    """Launch settings and 16-bit dot precisions of mesa (kernels/mesa/triton_function.py).

    prec: every dot outside the CG loops, cg_prec: the CG loops' dots, both for fp16/bf16
    inputs only (fp32 inputs always take "ieee"): tf32 is about 5e-4 relative per product,
    far below bf16's rounding. The CG kernels of the backward run 32 rows per program above
    head dim 64 (fewer registers; 1.2x faster at T = 8192), the forward the whole 64-token chunk, both
    on fp16 operands scaled by a carried norm (fwd / bwd 14.8 / 20.4 -> 12.1 / 16.2 ms at
    T = 8192 against per-row scaling). The state passes take 128-row blocks
    (1.62 -> 1.14 ms forward at T = 2048)."""

    prec: str = "tf32"
    cg_prec: str = "tf32"
    fwd_solve: SolveLaunch = SolveLaunch(rows=64, num_warps=8, weights_scan=True, diag_cg_prec=True,
                                         operands="fp16_normed")
    # The adjoint CG at K <= 64 (4 warps) on the forward's 64 rows: backward solve 7,590 /
    # 7,573 / 7,648 -> 4,638 / 4,600 / 4,622 us at T = 2k / 8k / 32k, K = 64 (forward+backward
    # 17.6 / 18.3 / 20.2 -> 14.6 / 15.0 / 17.1 ms); at K = 128 (8 warps) 64 rows lose, 10,243 ->
    # 12,948 us at 2k (one H100, records 20261207T143217, T143240)
    bwd_solve: SolveLaunch = SolveLaunch(rows=32, narrow_rows=64, num_warps=8, weights_scan=True, diag_cg_prec=True,
                                         operands="fp16_normed")
    states: StateLaunch = StateLaunch(max_BK=128, max_BD=64, min_BD=16, min_programs=2, num_warps=4, num_stages=2)
    # The gradient kernel, one H100, T = 2k / 8k / 32k, 4 warps over 32-column key blocks:
    # K = 64 3,547 / 3,679 / 3,821 us, K = 128 5,480 / 5,579 / 5,592, against 8 warps over the
    # whole K 5,416 / 5,574 / 5,708 and 5,467 / 5,561 / 5,572 (16 warps 17.8 ms at either;
    # records 20261206T223730-T223821); its GPU test errors equal the 8-warp form's to the
    # digit (2026-12-07; 4 warps over narrow blocks is where Triton 3.6 has miscompiled other
    # kernels: NarrowVLaunch)
    grads: GradsLaunch = GradsLaunch(num_warps=4, num_stages=1, BC=32)

    def __post_init__(self) -> None:
        for name in ("prec", "cg_prec"):
            if getattr(self, name) not in DOT_PRECISIONS:
                raise ValueError(f"MesaLaunch.{name} must be one of {DOT_PRECISIONS}, got {getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class PrepLaunch(KernelLaunch):
    """The linearized softmax GDN's running-mean kernels (linearized_softmax_gdn/triton_prep.py):
    tile_elems = BT * BD rows x features per loop step (enough bytes in flight per program);
    the feature block BD is halved from max_BD, down to min_BD, while fewer than
    min_programs programs would run. fwd_by_dot / bwd_by_dot: the forward's in-tile sums of
    16-bit inputs, the backward's of the fp32 cotangents (for a 16-bit dx), as products with
    triangular ones (kernels/common/triton/prefix.py; at most 64 rows a step). segment_rows
    (0: off): sequences longer than this many rows (a power of two, at least 64: whole
    chunks) are scanned in segments of that many rows, each by its own programs, after a
    pass that sums each segment; segment_max_heads (0: any): only where B * H is at most this
    many sequences of heads (with more, the programs already fill the GPU and the extra pass
    costs)."""

    max_BD: int = 64
    min_BD: int = 16
    tile_elems: int = 4096
    min_programs: int = 512
    fwd_by_dot: bool = False
    bwd_by_dot: bool = False
    segment_rows: int = 0
    segment_max_heads: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_pow2(self, "max_BD")
        _check_pow2(self, "min_BD")
        if self.segment_rows and (self.segment_rows < 64 or self.segment_rows & (self.segment_rows - 1)):
            raise ValueError(f"PrepLaunch.segment_rows must be 0 (off) or a power of two >= 64, got {self.segment_rows!r}")
        if self.segment_max_heads < 0:
            raise ValueError(f"PrepLaunch.segment_max_heads must be >= 0 (0: any), got {self.segment_max_heads!r}")

    def segments_at(self, n_heads: int, T: int) -> bool:
        """Whether B * H = n_heads sequences of T rows are scanned in segments."""
        return (bool(self.segment_rows) and T > self.segment_rows
                and (not self.segment_max_heads or n_heads <= self.segment_max_heads))


MEAN_FORMS = ("auto", "scan", "dots", "stored")  # LinGdnLaunch.mean_form
MEAN_ACC_RULES = ("never", "one_wave", "always")  # LinGdnLaunch.mean_in_acc


@dataclasses.dataclass(frozen=True)
class LinGdnLaunch:
    """Launch settings of linearized_softmax_gdn's own kernels; its delta rule runs the
    gated_delta_rule kernels under that op's settings, except that its training forward
    runs the state pass and then the output kernel (which adds the running mean of v),
    wherever gated_delta_rule's fused_fwd would fuse them, unless train_fused and the head
    dim is at most train_fused_max_K (fuses_training)."""

    # The scans' in-tile sums on the tensor cores (fwd_by_dot, bwd_by_dot): running_mean_fwd
    # 522 / 548 / 869 -> 430 / 512 / 842 us and running_mean_bwd 1,061 / 1,126 / 1,189 -> 632 /
    # 641 / 1,030 at T = 2k / 8k / 32k, K = 128 (one H100, records 20261207T024458, T024423)
    prep: PrepLaunch = PrepLaunch(max_BD=64, min_BD=16, tile_elems=4096, min_programs=512, num_warps=4, num_stages=3,
                                  fwd_by_dot=True, bwd_by_dot=True)
    # The training pass with the output and the running mean fused took 2,047 us at 2k, K =
    # 128 (GDN's without the mean 1,199); unfused, the state pass and the output take 566 +
    # 748, and lin_gdn's forward+backward 8.41 -> 7.60 ms there, but at K = 64 (2k) 6.54 ->
    # 6.71 (8k and 32k, where the fused pass does not run: within 1 %; one H100, records
    # 20261206T194925, T224016)
    train_fused: bool = True
    train_fused_max_K: int = 64
    # How the output forms the running mean of v it adds (MEAN_FORMS): "scan", in-chunk sums by
    # tl.cumsum, a scan inside the state pass's sequential loop; "dots", those sums of 16-bit v
    # as a product with triangular ones (kernels/common/triton/prefix.py); "stored", not at all:
    # the scan of v writes the mean whole in v's dtype (one more [B, T, H, V] write there) and
    # the output only loads and adds it (candidate 21, not taken: lin_gdn's forward at T = 2k / 8k
    # / 32k 2.11 / 2.23 / 2.52 -> 1.95 / 2.06 / 2.55 ms at K = 128, 1.94 / 2.19 / 2.62 -> 2.01 /
    # 2.13 / 2.77 at K = 64, forward+backward within 1 %; one H100); "auto", per pass
    # (RunningMean.sums_by_dot): dots in the output kernel, and in the fused state pass at K <=
    # 64 or within one wave of programs. One H100, T = 2k / 8k / 32k (records 20261207T024423,
    # T024458), scan -> dots: the output kernel 761 / 768 / 780 -> 701 / 715 / 740 us at K =
    # 128, the no-gradient fused pass 750 / 1,052 / 1,499 -> 592 / 810 / 1,056 at K = 64, and
    # at K = 128 1,187 / 1,174 / 1,738 -> 1,483 / 1,478 / 1,195 (2,048 / 512 / 128 programs on
    # 132 multiprocessors)
    mean_form: str = "auto"
    # Where a pass takes the dots, whether the product with triangular ones accumulates into
    # the output's own fp32 tile scaled by t rather than into a tile of its own added after
    # (MEAN_ACC_RULES, RunningMean.accumulates): "always"; "one_wave", in the fused state pass
    # where its programs fill at most one wave; "never". One H100 (Triton 3.7.1, records
    # 20261207T103211, T103303, T103312), no-gradient fused pass: at 32k (128 programs on 132
    # multiprocessors) 1,273 -> 1,206 us at K = 128 and 959 -> 915 at K = 64, the forward 2.590 /
    # 2.675 -> 2.521 / 2.628 ms; at 8k, K = 64 (512 programs) 695 -> 789; at 2k, K = 64 and in
    # the output kernel within 1 %; with the dots at K = 128 and more programs 1,109 -> 1,426
    mean_in_acc: str = "one_wave"

    def __post_init__(self) -> None:
        if not isinstance(self.train_fused_max_K, int) or self.train_fused_max_K < 0:
            raise ValueError(f"LinGdnLaunch.train_fused_max_K must be an int >= 0, got {self.train_fused_max_K!r}")
        if self.mean_form not in MEAN_FORMS:
            raise ValueError(f"LinGdnLaunch.mean_form must be one of {list(MEAN_FORMS)}, got {self.mean_form!r}")
        if self.mean_in_acc not in MEAN_ACC_RULES:
            raise ValueError(f"LinGdnLaunch.mean_in_acc must be one of {list(MEAN_ACC_RULES)}, got {self.mean_in_acc!r}")

    def fuses_training(self, K: int) -> bool:
        """Whether the training forward at head dim K may fuse its output into the state pass."""
        return self.train_fused and K <= self.train_fused_max_K


# dv formed in the dq/dk kernel where one 64-key block spans K (K <= 64): forward+backward at
# K = 64, T = 2k / 8k / 32k, 2.34 / 2.58 / 2.77 -> 2.04 / 2.28 / 2.45 ms for scalar-gate GLA and
# 1.95 / 2.01 / 2.43 -> 1.70 / 1.77 / 2.17 for linear attention; one 128-key block on 8 warps
# (which would take K = 128 too) was slower at both head dims, 3.12 / 3.35 / 3.48 ms for GLA at
# K = 64 (one H100, Triton 3.6, records 20261207T080521-T080559, T081040, T081054; GPU-tested
# 2026-12-07)
_DQK_FUSED_DV = DqkLaunch(BK=64, BV=64, num_warps=4, num_stages=2, fuse_dv=True)
# The backward state pass of linear attention and scalar-gate GLA narrowed only below one wave
# of programs: at T = 8k (128 and 256 sequences of heads) 64-column blocks rather than 32, the
# pass 544 / 361 -> 397 / 290 us at K = 128 / 64, GLA forward+backward 3.087 / 2.119 -> 2.944 /
# 2.064 ms, linear 2.651 / 1.778 -> 2.551 / 1.739; 2k and 32k within 1 % (one H100, Triton
# 3.7.1, records 20261207T092622-T092647; GPU-tested 2026-12-07)
_BWD_STATES_ONE_WAVE = dataclasses.replace(ChunkLaunch.bwd_states, min_waves=1)

DEFAULTS: Mapping[str, Any] = MappingProxyType({
    # segments from 64 sequences of heads down (min_heads 128): at K = 64, T = 32k (64 sequences,
    # one program walking 512 chunks) forward 0.783 -> 0.610 ms, forward+backward 2.200 -> 2.067;
    # elsewhere unchanged (one H100, Triton 3.7.1, records 20261207T092139, T092147; segments
    # GPU-tested 2026-12-07)
    "linear_attention": ChunkLaunch(
        bwd_dqk=_DQK_FUSED_DV,
        fwd_fused=dataclasses.replace(ChunkLaunch.fwd_fused, min_heads=128),
        bwd_states=_BWD_STATES_ONE_WAVE,
    ),
    "gated_linear_attention": ChunkLaunch(
        bwd_dqk=_DQK_FUSED_DV,
        # the scalar-gate fused forward at three stages for K <= 64: that kernel 397 / 619 / 403
        # -> 366 / 545 / 374 us at T = 2k / 8k / 32k (the forward's wall time at 2k, 0.45 ->
        # 0.52 ms, and 0.46 -> 0.44 in an earlier call, moves with the host); at K = 128 three
        # stages were much slower, 0.52 -> 0.81 ms at 2k (one H100, records 20261207T080521,
        # T080603, T054910-T054930; GPU-tested 2026-12-07)
        # each token's decay on its value row (decay_on_v), in the segments' local states and
        # in the fused pass above K = 64: the forward at K = 128, T = 2k / 8k / 32k 0.500 / 0.705 /
        # 0.742 -> 0.463 / 0.640 / 0.684 ms (fused kernel 475 / 501 / 488 -> 439 / 447 / 445 us),
        # at K = 64, 32k the local states 213 -> 177 us; the fused pass at K = 64 with it 360 /
        # 498 / 368 -> 361 / 570 / 370 us, slower at 8k, where 32-column blocks then walked 128
        # chunks (min_waves 2; untimed with the 64-column blocks min_waves 1 keeps there) (one
        # H100, Triton 3.7.1, records 20261207T085505, T085522; GPU-tested 2026-12-07)
        # narrowed only below one wave of programs (min_waves 1): at K = 64, T = 8k (256 sequences
        # of heads) 64-column blocks rather than 32, forward 0.517 -> 0.404 ms (fused kernel 501
        # -> 387 us), forward+backward 2.213 -> 2.155; elsewhere within 1 % (one H100, Triton
        # 3.7.1, records 20261207T092122, T092138)
        fwd_fused_scalar=dataclasses.replace(ChunkLaunch.fwd_fused_scalar, narrow_num_stages=3, decay_on_v=True,
                                             narrow_decay_on_v=False, min_waves=1),
        bwd_states=_BWD_STATES_ONE_WAVE,
    ),
    # DeltaNet's dq/dk/dW kernel over the whole V at once (dqkw BV 128) took K = 128, T = 2k /
    # 8k / 32k from 1,481-1,500 to 1,375 / 1,380 / 1,382 us, K = 64 unchanged (one H100,
    # records 20261206T194651, T224005; one stage instead of two: 1,539, T223933; GPU-tested
    # 2026-12-07)
    "delta_rule": DeltaLaunch(
        # three stages where the backward state pass runs at most one wave of programs: at 32k
        # (128 programs) 1,395 -> 987 us at K = 128 and 1,019 -> 660 at K = 64; three
        # everywhere were slower at 8k, K = 128 (256 programs: 855 -> 989; one H100, records
        # 20261207T024308, T024410)
        state_bwd=dataclasses.replace(DeltaLaunch.state_bwd, few_program_stages=3, few_program_waves=1),
        # dk's share in bf16: forward+backward 4.75 / 5.10 / 5.29 -> 4.51 / 4.83 / 5.00 ms at K =
        # 128, 4.20 / 4.64 / 4.91 -> 3.97 / 4.38 / 4.66 at K = 64 (dqkw and wy_bwd ~10 % each);
        # narrowing only below one wave: 8k 5.10 -> 5.00 (K = 128), 4.64 -> 4.36 (K = 64), the
        # forward at 8k, K = 64 1.38 -> 1.25 (one H100, records 20261207T041508-T041948)
        dqkw=DqkwLaunch(BK=64, BV=128, num_warps=4, num_stages=2, dk_part_16bit=True),
        seq=NarrowingLaunch(min_BV=32, min_waves=1),
        # the chunk-parallel kernels heads first from 256 chunks a sequence on, as GDN's: at
        # 32k, K = 128 forward 1.20 -> 1.16 ms, forward+backward 5.08 -> 4.93; at K = 64 the
        # forward 1.37 -> 1.40 and the backward's kernels 4.80 -> 4.55 ms summed (its wall median,
        # 6.93 ms between p20 4.56 and p80 9.42, was disturbed); 2k and 8k run chunks first
        # either way (one H100, Triton 3.7.1, records 20261207T144238, T144310)
        heads_first_from_chunks=256,
    ),
    # GDN forms dU_local in its backward state pass at K <= 64 only (DeltaLaunch.state_bwd says
    # why; at K = 128 as well, forward+backward 5.89 / 5.94 / 6.61 -> 5.78 / 5.81 / 6.99 ms at T =
    # 2k / 8k / 32k). DeltaNet's later defaults (dk's share in bf16, narrowing below one wave,
    # three stages within one wave) and the row factors on the V side took its forward+backward
    # at K = 128 from 5.99 / 6.11 / 6.78 to 5.54 / 5.59 / 5.83 ms (its state pass 1,239 / 1,143 /
    # 1,595 -> 919 / 916 / 814 us) and at K = 64 from 4.85 / 5.35 / 6.63 to 4.70 / 4.87 / 6.15
    # (one H100, Triton 3.6, records 20261207T080439-T080608; GPU-tested 2026-12-07)
    "gated_delta_rule": DeltaLaunch(
        state_bwd=dataclasses.replace(DeltaLaunch.state_bwd, max_K=64, few_program_stages=3, few_program_waves=1,
                                      factors_on_v=True),
        # dqkw over 32-column V-blocks at head dims up to 64 (narrow_BV): forward+backward at K =
        # 64, T = 2k / 8k / 32k 4.86 / 5.03 / 5.66 -> 4.77 / 4.94 / 5.55 ms (dqkw 1,439 / 1,431 /
        # 1,424 -> 1,332 / 1,354 / 1,309 us); at K = 128 it keeps 64 columns, where 32 lost
        # (1,493 -> 1,883 us at 2k) (one H100, Triton 3.7.1, records 20261207T155252, T155349;
        # GPU-tested 2026-12-07)
        dqkw=dataclasses.replace(DeltaLaunch.dqkw, dk_part_16bit=True, narrow_BV=32),
        seq=NarrowingLaunch(min_BV=32, min_waves=1),
        # the chunk-parallel kernels heads first from 256 chunks a sequence on (T >= 16k at
        # chunk 64); heads first everywhere against chunks first, T = 2k / 8k / 32k (32 / 128 /
        # 512 chunks): forward+backward K = 128 5.48 / 5.56 / 5.79 -> 5.57 / 5.50 / 5.42 ms, K =
        # 64 4.89 / 5.04 / 6.16 -> 5.09 / 5.06 / 5.66; forward K = 128 1.22 / 1.23 / 1.39 ->
        # 1.24 / 1.23 / 1.33, K = 64 1.31 / 1.31 / 1.61 -> 1.40 / 1.39 / 1.55 (one H100, Triton
        # 3.7.1, records 20261207T143008, T143103); lin_gdn, which runs these kernels under these
        # settings, without it at 32k: forward+backward 7.06 -> 7.26 ms at K = 128, 7.08 -> 7.43 at
        # K = 64, the forward within 0.5 % (records 20261207T144331, T144449)
        heads_first_from_chunks=256,
    ),
    "mesa": MesaLaunch(),
    # the running-mean scans in segments of 2,048 rows where at most 64 sequences of heads run:
    # at T = 32k (32 and 64 sequences) forward 2.82 / 2.90 -> 2.58 / 2.67 ms and forward+backward
    # 7.67 / 7.73 -> 7.28 / 7.34 at K = 128 / 64; at 8k (128 and 256 sequences) segments were
    # slower, 2.25 -> 2.41 and 6.71 -> 7.17 at K = 128; segments of 8,192 rows gained 2 % at 32k
    # (one H100, Triton 3.7.1, records 20261207T092148-T092238; segments GPU-tested 2026-12-07)
    "linearized_softmax_gdn": LinGdnLaunch(
        prep=dataclasses.replace(LinGdnLaunch.prep, segment_rows=2048, segment_max_heads=64)),
})

_OVERRIDES: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "launch_overrides", default=MappingProxyType({}))
_USED: contextvars.ContextVar[dict[str, dict[str, Any]] | None] = contextvars.ContextVar("launch_used", default=None)

S = TypeVar("S")


def _op_check(op: str) -> None:
    if op not in DEFAULTS:
        raise ValueError(f"no launch settings for op {op!r}; ops with Triton kernels: {sorted(DEFAULTS)}")


def settings(op: str) -> Any:
    """The settings object of `op` in effect here (DEFAULTS[op] unless launch_settings says otherwise)."""
    _op_check(op)
    return _OVERRIDES.get().get(op, DEFAULTS[op])


def _coerce(current: Any, value: Any, where: str) -> Any:
    """`value` as the type of the field it replaces (JSON gives 0/1 for switches, ints for floats)."""
    if isinstance(current, bool):
        if value not in (0, 1, True, False):
            raise ValueError(f"{where}: expected a switch (true/false or 0/1), got {value!r}")
        return bool(value)
    if isinstance(current, int):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return int(value)
    if isinstance(current, str):
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    raise ValueError(f"{where}: cannot set a field of type {type(current).__name__}")


def with_changes(obj: S, changes: S | Mapping[str, Any], where: str = "") -> S:
    """`obj` with `changes` applied: a settings object of obj's type replaces it whole; a
    mapping replaces the fields it names, recursing into nested settings objects (so
    {"bwd_dqkg": {"split_paths": False}} changes one field of one kernel). Unknown names
    and ill-typed values raise ValueError; every result is validated by its __post_init__."""
    where = where or type(obj).__name__
    if dataclasses.is_dataclass(changes) and not isinstance(changes, type):
        if type(changes) is not type(obj):
            raise ValueError(f"{where}: expected a {type(obj).__name__}, got a {type(changes).__name__}")
        return changes  # type: ignore[return-value]
    if not isinstance(changes, Mapping):
        raise ValueError(f"{where}: expected a mapping of field changes or a {type(obj).__name__}, got {changes!r}")
    names = {f.name for f in dataclasses.fields(obj)}  # type: ignore[arg-type]
    new: dict[str, Any] = {}
    for name, value in changes.items():
        if name not in names:
            raise ValueError(f"{where}: no setting {name!r}; it has {sorted(names)}")
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            new[name] = with_changes(current, value, f"{where}.{name}")
        else:
            new[name] = _coerce(current, value, f"{where}.{name}")
    return dataclasses.replace(obj, **new)  # type: ignore[type-var]


@contextlib.contextmanager
def launch_settings(**ops: Any) -> Iterator[None]:
    """Run the block under other launch settings: each keyword is an op name, its value a
    settings object of that op's type or a mapping of changes (with_changes) applied on
    top of the settings in effect at entry. Restored on exit; nests; no global changes.

        with launch_settings(linear_attention={"fwd_states": {"BK": 64}}):
            ...
    """
    current = _OVERRIDES.get()
    new = dict(current)
    for op, changes in ops.items():
        new[op] = with_changes(settings(op), changes, op)
    token = _OVERRIDES.set(MappingProxyType(new))
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def as_dict(obj: Any) -> dict[str, Any]:
    """A settings object as nested plain dicts (JSON-able)."""
    return dataclasses.asdict(obj)


def settings_in_effect(ops: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """op -> its settings in effect here, as a JSON-able dict; every op with Triton kernels
    when `ops` is None."""
    return {op: as_dict(settings(op)) for op in (DEFAULTS if ops is None else ops)}


def encode(op: str) -> str:
    """The settings of `op` in effect here as a JSON string: how a forward hands them to its
    backward (custom ops take strings, not objects)."""
    return json.dumps(as_dict(settings(op)), sort_keys=True)


@functools.lru_cache(maxsize=256)
def decode(op: str, text: str) -> Any:
    """The settings object `encode(op)` wrote."""
    _op_check(op)
    return with_changes(DEFAULTS[op], json.loads(text), op)


@contextlib.contextmanager
def recording_launches() -> Iterator[dict[str, dict[str, Any]]]:
    """Collect, into the yielded dict, op -> the settings (JSON-able) each Triton op ran its
    first forward with inside the block."""
    used: dict[str, dict[str, Any]] = {}
    token = _USED.set(used)
    try:
        yield used
    finally:
        _USED.reset(token)


def note_launch(op: str) -> Any:
    """The settings of `op` in effect here, noted for recording_launches (the first call of
    each op inside a recording counts)."""
    current = settings(op)
    used = _USED.get()
    if used is not None and op not in used:
        used[op] = as_dict(current)
    return current
