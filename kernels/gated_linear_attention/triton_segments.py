"""The state entering each of S segments of a sequence, so that the fused forward can run its
segments in parallel when there are few sequences of heads (long T, small B * H).

A segment is CPS consecutive chunks. Two passes:
  1. segment_local_states: every (V-block, head, segment) program, but the last segment's,
     walks its segment's chunks from a zero state,
     S_{n+1} = e^{gamma_C} S_n + (K ⊙ e^{gamma_C - gamma})^T V_n, and stores the segment's
     local final state L_s (fp32) and its total decay D_s, the product of the chunks'
     e^{gamma_C} (stored per key row: equal entries for a scalar gate, nothing without a
     gate); a scalar gate's factors go on V's rows instead with decay_on_v (as in the fused
     forward). Fully parallel. No segment starts from the last one's L and D, so they are not
     formed: the pass reads (S - 1) / S of k and v (the final state comes from the fused
     forward's own walk of the last segment).
  2. segment_carry: C_0 = h0 (or 0) and C_{s+1} = D_s ⊙ C_s + L_s, one program per (V-block,
     head) walking the segments: the states entering the S segments (fp32).
The fused forward (triton_fused_forward.py) then starts segment s from C_s. The maths is the state
recursion of triton_states.py regrouped; only the order of fp32 additions differs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.triton.gates import GATE_NONE
from kernels.common.triton.tiles import load_tile, load_tile_t, store_tile
from kernels.common.triton.utils import new_buffer, warps
from kernels.gated_linear_attention.triton_states import _decay_rows, _decay_value_rows


@triton.jit
def segment_local_states_kernel(
    k, v, gamma, L, D, T, NT, CPS, S,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, DOT_PREC: tl.constexpr, DECAY_ON_V: tl.constexpr,
):
    """L: [B * H * (S - 1), K, V], D: [B * H * (S - 1), K] fp32 (segments 0 .. S - 2).
    Grid (cdiv(V, BV), B * H, S - 1)."""
    i_v, i_bh, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    o_k = tl.arange(0, BK)
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    # the segment's decay: one [BK] vector for both gate kinds (a scalar gate's entries equal)
    b_dec = tl.full([BK], 1.0, dtype=tl.float32)
    for i_t in range(i_s * CPS, tl.minimum((i_s + 1) * CPS, NT)):
        t0 = i_t * BT
        b_kt = load_tile_t(k + seq * K, t0, 0, T, K, H * K, BT, BK)
        b_v = load_tile(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        if GATE == 1 and DECAY_ON_V:  # the factors on the value rows (FusedForwardLaunch.decay_on_v)
            b_v, b_decay = _decay_value_rows(b_v, gamma, seq, t0, T, H, BT)
            b_h *= b_decay
            b_dec *= b_decay
        elif GATE == 1:
            b_kt, b_decay = _decay_rows(b_kt, gamma, seq, t0, T, H, K, BT, BK, 0, GATE, True)
            b_h *= b_decay
            b_dec *= b_decay
        elif GATE == 2:
            b_kt, b_decay = _decay_rows(b_kt, gamma, seq, t0, T, H, K, BT, BK, 0, GATE, True)
            b_h *= b_decay[:, None]
            b_dec *= b_decay
        b_h += tl.dot(b_kt, b_v, input_precision=DOT_PREC)
    seg = (i_bh * (S - 1) + i_s).to(tl.int64)
    store_tile(L + seg * K * V, b_h, 0, i_v * BV, K, V, V, BK, BV)
    if GATE != 0:  # noqa: SIM102 - a compile-time test outside, a per-program one inside
        if i_v == 0:
            tl.store(D + seg * K + o_k, b_dec, mask=o_k < K)


@triton.jit
def segment_carry_kernel(
    L, D, h0, C, S,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, HAS_H0: tl.constexpr,
):
    """C: [B * H * S, K, V] fp32 from L, D of segments 0 .. S - 2. Grid (cdiv(V, BV), B * H)."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    o_k = tl.arange(0, BK)
    b_c = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_H0:
        b_c += load_tile(h0 + i_bh.to(tl.int64) * K * V, 0, i_v * BV, K, V, V, BK, BV)
    store_tile(C + (i_bh * S).to(tl.int64) * K * V, b_c, 0, i_v * BV, K, V, V, BK, BV)
    for i_s in range(S - 1):
        seg = (i_bh * (S - 1) + i_s).to(tl.int64)
        if GATE != 0:
            b_c *= tl.load(D + seg * K + o_k, mask=o_k < K, other=0.0)[:, None]
        b_c += load_tile(L + seg * K * V, 0, i_v * BV, K, V, V, BK, BV)
        store_tile(C + (i_bh * S + i_s + 1).to(tl.int64) * K * V, b_c, 0, i_v * BV, K, V, V, BK, BV)


def segment_entry_states(
    k: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor | None, gate: int, h0: torch.Tensor | None,
    chunk_size: int, chunks_per_segment: int, BV: int, dot_prec: str, num_warps: int, decay_on_v: bool = False,
) -> torch.Tensor:
    """C: [B * H * S, K, V] fp32, the state entering each segment of `chunks_per_segment`
    chunks (S = ceil(NT / chunks_per_segment) >= 2), C[(b * H + h) * S + s].

    k: [B, T, H, K] (K <= 128); v: [B, T, H, V]; gamma: cumulative log2-gates [B, T, H] or
    [B, T, H, K] fp32, or None; h0: [B, H, K, V] fp32 or None. decay_on_v: a scalar gate's
    factors on the value rows (FusedForwardLaunch.decay_on_v)."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    S = triton.cdiv(NT, chunks_per_segment)
    if S < 2:
        raise ValueError(f"segment_entry_states: {NT} chunks of {chunks_per_segment} a segment make one segment; "
                         "it needs at least two (one segment starts from h0)")
    BK = max(16, triton.next_power_of_2(K))
    L = new_buffer((B * H * (S - 1), K, V), torch.float32, k.device)
    D = new_buffer((B * H * (S - 1), K), torch.float32, k.device) if gate != GATE_NONE else L
    segment_local_states_kernel[(triton.cdiv(V, BV), B * H, S - 1)](
        k, v, gamma if gamma is not None else k, L, D, T, NT, chunks_per_segment, S,
        H=H, K=K, V=V, BT=chunk_size, BK=BK, BV=BV, GATE=gate, DOT_PREC=dot_prec, DECAY_ON_V=decay_on_v,
        num_warps=warps(num_warps), num_stages=2,
    )
    C = new_buffer((B * H * S, K, V), torch.float32, k.device)
    BVc = min(BV, 64)
    segment_carry_kernel[(triton.cdiv(V, BVc), B * H)](
        L, D, h0 if h0 is not None else L, C, S, K=K, V=V, BK=BK, BV=BVc,
        GATE=gate, HAS_H0=h0 is not None, num_warps=warps(4),
    )
    return C
