"""Launch settings of the delta rules' kernels, delta_rule and gated_delta_rule
(kernels/gated_delta_rule; DeltaLaunch, one field per kernel)."""

from __future__ import annotations

import dataclasses

from kernels.common.launch.base import (
    GRID_YZ_MAX,
    TILE_WIDTHS,
    KernelLaunch,
    NarrowingLaunch,
    NarrowVLaunch,
    TileLaunch,
    check_pow2,
)


@dataclasses.dataclass(frozen=True)
class WyFwdLaunch(TileLaunch):
    """The delta rules' per-chunk WY preparation. tf32_solve: the chunk inverse of 16-bit
    inputs on tf32 tensor cores (the inverse is rounded to 16 bits anyway); False: true fp32.
    narrow_num_warps (0: num_warps) is the warps of a program at head dims up to narrow_max_K
    (warps_at)."""

    tf32_solve: bool = True
    narrow_num_warps: int = 0
    narrow_max_K: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pow2(self, "narrow_num_warps", (0, 1, 2, 4, 8, 16, 32))

    def warps_at(self, K: int) -> int:
        """num_warps of a launch at head dim K."""
        return self.narrow_num_warps if self.narrow_num_warps and K <= self.narrow_max_K else self.num_warps


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
        check_pow2(self, "BV")
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
        check_pow2(self, "narrow_BV", (0, *TILE_WIDTHS))

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
    # One warp a program up to K = 64: a program takes about the same time at K = 64 as at 128
    # (a chunk's gates and 64 x 64 solve bound it, not K), and the kernel holds 255 registers
    # at 1, 2 or 4 warps, so one warp fits twice the programs of two on an SM. wy_fwd at T = 2k /
    # 8k / 32k, K = 64 (32 heads): GDN 973 / 1,038 / 1,065 -> 722 / 747 / 696 us (forward+backward
    # 4.78 / 4.93 / 5.57 -> 4.53 / 4.67 / 5.22 ms), DeltaNet 876 / 938 / 953 -> 663 / 684 / 640;
    # at K = 128 one warp was slower (GDN 526 / 547 / 532 -> 551 / 566 / 539; one H100, Triton
    # 3.7.1, records 20261207T222310-T222543; GPU-tested 2026-12-07)
    wy_fwd: WyFwdLaunch = WyFwdLaunch(BK=64, BV=64, num_warps=2, num_stages=3, tf32_solve=True, narrow_num_warps=1)
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
    # store_p and p_in_wy hold at head dims above p_above_K only (0: every head dim)
    p_above_K: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.p_above_K, int) or self.p_above_K < 0:
            raise ValueError(f"DeltaLaunch.p_above_K must be a head dim >= 0 (0: every one), got {self.p_above_K!r}")
        if not isinstance(self.heads_first_from_chunks, int) or self.heads_first_from_chunks < 0:
            raise ValueError("DeltaLaunch.heads_first_from_chunks must be a count of chunks >= 0 (0: never), "
                             f"got {self.heads_first_from_chunks!r}")

    def keeps_p(self, K: int) -> bool:
        """Whether a training forward at head dim K stores P for its backward (store_p or p_in_wy)."""
        return (self.store_p or self.p_in_wy) and K > self.p_above_K

    def p_in_wy_at(self, K: int) -> bool:
        """Whether wy_fwd forms P for a training forward at head dim K (p_in_wy)."""
        return self.p_in_wy and K > self.p_above_K

    def heads_first_at(self, n_chunks: int) -> bool:
        """Whether the chunk-parallel kernels of a sequence of n_chunks chunks launch the heads
        on the grid's faster axis (chunk_grid). The rule by length leaves the chunks first
        past GRID_YZ_MAX chunks, which the slower axis could not hold (heads_first forces
        the order, and chunk_grid refuses such a grid)."""
        return self.heads_first or 0 < self.heads_first_from_chunks <= n_chunks <= GRID_YZ_MAX
