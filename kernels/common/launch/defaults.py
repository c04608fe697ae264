"""The launch settings each op with Triton kernels runs with unless launch_settings says
otherwise (DEFAULTS), with the measurements that chose them where they differ from each
settings class's own defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from kernels.common.launch.base import NarrowingLaunch
from kernels.common.launch.chunk import ChunkLaunch, DqkLaunch
from kernels.common.launch.delta import DeltaLaunch, DqkwLaunch
from kernels.common.launch.lin_gdn import LinGdnLaunch
from kernels.common.launch.mesa import MesaLaunch

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
        # P formed by wy_fwd and read by the output pass and dU_local above K = 64: forward+backward
        # at K = 128, T = 2k / 8k / 32k 5.51 / 5.57 / 5.44 -> 5.29 / 5.56 / 5.37 ms (the fused
        # pass at 2k 1,185 -> 921 us, du_local 347 -> 221, wy_fwd 526 -> 704); at K = 64 slower,
        # 4.78 / 4.93 / 5.57 -> 5.26 / 5.50 / 5.69 (wy_fwd 973 -> 1,287 at 2k); P stored by the
        # output pass instead (store_p) was slower at 2k (5.72: the fused pass 1,533 us) and gained
        # 1 % at 8k and 32k (one H100, Triton 3.7.1, records 20261207T222310-T222500; GPU-tested
        # 2026-12-07)
        p_in_wy=True,
        p_above_K=64,
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
