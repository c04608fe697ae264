"""The forward pass in one sequential kernel: state passing and output together.

The two-kernel forward (triton_states.py then triton_output.py) writes every chunk's entering state S_n
to memory and reads it back for the output, and reads q, k, v twice. Here each program
owns one V-block of one head, keeps its [K, BV] state in fp32 registers and walks the
chunks in order; per chunk it
    1. stores S_n (in the state dtype: the backward needs it; not when no gradient is
       wanted, STORE_H off),
    2. writes O_n = scale (Q ⊙ e^gamma) S_n + A V_n, A = scale (Q K^T ⊙ Gamma) (causal),
       with S_n rounded to the state dtype exactly as the output kernel reads it back,
    3. moves on: S_{n+1} = e^{gamma_C} S_n + (K ⊙ e^{gamma_C - gamma})^T V_n, or for a scalar
       gate with FusedForwardLaunch.decay_on_v, K^T (e^{gamma_C - gamma} ⊙ V_n): the factor
       of each token on the [BT, BV] value tile rather than the [BK, BT] key tile.
So outputs and states equal the two-kernel path's (decay_on_v rounds the scaled values
instead of the scaled keys to 16 bits before the product, so there the states differ from
it by that rounding). The price is recomputing A once per
V-block and fewer programs (B * H * V-blocks): with few sequences the chunks of one
program run one after another. ChunkLaunch.fwd_fused (and its _scalar / _vector
fields, kernels/common/launch/) say when it is used: from min_heads sequences (B * H) on. Below that, with
"segment_programs" > 0, each sequence is cut into segments of chunks that run in parallel,
each from its entering state (triton_segments.py: two cheap passes first), until about that many
programs run; with 0 the two-kernel forward runs instead.

The whole K must fit one tile (K <= 128 here); a vector gate brings its intra-chunk
matrix A precomputed (triton_vector.py), as in triton_output.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.launch import FusedForwardLaunch
from kernels.common.triton.gates import GATE_VECTOR
from kernels.common.triton.tiles import load_gamma_rows, load_tile, load_tile_t, store_tile
from kernels.common.triton.utils import block_size, chunk_launch, dot_precision, new_buffer, sequential_blocks, warps
from kernels.gated_linear_attention.triton_segments import segment_entry_states
from kernels.gated_linear_attention.triton_states import _decay_rows, _decay_value_rows

MAX_K = 128  # the state tile is [K, BV] in registers


@triton.jit
def chunk_fwd_fused_kernel(
    q, k, v, gamma, A, h_in, h, ht, o, scale, T, NT, CPS, S,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, HAS_A: tl.constexpr, HAS_IN: tl.constexpr, STORE_H: tl.constexpr,
    STORE_HT: tl.constexpr, DOT_PREC: tl.constexpr, DECAY_ON_V: tl.constexpr,
):
    # program (V-block, head, segment): chunks i_s * CPS .. of one head, from the state
    # entering the segment, h_in[(i_bh * S + i_s)] (h0 itself when S = 1)
    i_v, i_bh, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    o_i = tl.arange(0, BT)
    m_causal = o_i[:, None] >= o_i[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_IN:
        b_h += load_tile(h_in + (i_bh * S + i_s).to(tl.int64) * K * V, 0, i_v * BV, K, V, V, BK, BV)
    for i_t in range(i_s * CPS, tl.minimum((i_s + 1) * CPS, NT)):
        t0 = i_t * BT
        p_state = h + (i_bh * NT + i_t).to(tl.int64) * K * V
        if STORE_H:
            store_tile(p_state, b_h, 0, i_v * BV, K, V, V, BK, BV)
        b_q = load_tile(q + seq * K, t0, 0, T, K, H * K, BT, BK)
        b_kt = load_tile_t(k + seq * K, t0, 0, T, K, H * K, BT, BK)
        b_v = load_tile(v + seq * V, t0, i_v * BV, T, V, H * V, BT, BV)
        # the state as the two-kernel path reads it back: rounded to the state dtype
        b_hs = b_h.to(p_state.dtype.element_ty).to(b_q.dtype)
        if GATE == 2:
            b_g = load_tile(gamma + seq * K, t0, 0, T, K, H * K, BT, BK)
            b_o = tl.dot((b_q * tl.exp2(b_g)).to(b_q.dtype), b_hs, input_precision=DOT_PREC)
        else:
            b_o = tl.dot(b_q, b_hs, input_precision=DOT_PREC)
        if HAS_A:
            b_A = load_tile(A + seq * BT, t0, 0, T, BT, H * BT, BT, BT)
        else:
            b_A = tl.dot(b_q, b_kt, input_precision=DOT_PREC)
            if GATE == 1:
                b_gs = load_gamma_rows(gamma + seq, t0, T, H, BT)
                b_o *= tl.exp2(b_gs)[:, None]
                b_A *= tl.exp2(tl.where(m_causal, b_gs[:, None] - b_gs[None, :], float("-inf"))) * scale
            else:
                b_A = tl.where(m_causal, b_A, 0.0) * scale
        b_o = b_o * scale + tl.dot(b_A.to(b_v.dtype), b_v, input_precision=DOT_PREC)
        store_tile(o + seq * V, b_o, t0, i_v * BV, T, V, H * V, BT, BV)
        if GATE == 1 and DECAY_ON_V:
            b_v, b_decay = _decay_value_rows(b_v, gamma, seq, t0, T, H, BT)
            b_h *= b_decay
        elif GATE == 1:
            b_kt, b_decay = _decay_rows(b_kt, gamma, seq, t0, T, H, K, BT, BK, 0, GATE, True)
            b_h *= b_decay
        elif GATE == 2:
            b_kt, b_decay = _decay_rows(b_kt, gamma, seq, t0, T, H, K, BT, BK, 0, GATE, True)
            b_h *= b_decay[:, None]
        b_h += tl.dot(b_kt, b_v, input_precision=DOT_PREC)
    if STORE_HT:  # noqa: SIM102 - a compile-time test outside, a per-program one inside
        if i_s == S - 1:
            store_tile(ht + i_bh.to(tl.int64) * K * V, b_h, 0, i_v * BV, K, V, V, BK, BV)


# the ChunkLaunch field of the fused forward, indexed by gate mode (GATE_NONE, GATE_SCALAR, GATE_VECTOR)
FUSED_FORWARD_FIELDS = ("fwd_fused", "fwd_fused_scalar", "fwd_fused_vector")


def launch_name(gate: int) -> str:
    """The ChunkLaunch field of the fused forward for a gate mode."""
    return FUSED_FORWARD_FIELDS[gate]


def fused_launch(gate: int) -> FusedForwardLaunch:
    """The fused forward's launch settings in effect for a gate mode."""
    return getattr(chunk_launch(gate), launch_name(gate))


def fused_forward_applies(K: int, n_heads: int, gate: int) -> bool:
    """Whether chunk_fwd_fused runs for key width K and n_heads = B * H sequences of heads
    under the launch settings in effect: enabled, K <= 128, and either n_heads >= min_heads
    (one sequential pass per sequence) or segment_programs > 0 (fewer sequences: each is cut
    into segments run in parallel)."""
    cfg = fused_launch(gate)
    return cfg.enabled and K <= MAX_K and (n_heads >= cfg.min_heads or cfg.segment_programs > 0)


def segment_target(n_heads: int, gate: int) -> int:
    """The program count segments should reach (0: no segments): LAUNCH's segment_programs
    when n_heads = B * H is below min_heads, else 0 (enough sequences to fill the GPU)."""
    cfg = fused_launch(gate)
    return cfg.segment_programs if n_heads < cfg.min_heads else 0


def chunks_per_segment(NT: int, programs: int, target: int) -> int:
    """Chunks per segment so that programs x segments comes close to `target` programs
    without passing it (target <= 2 * programs: one segment, the whole sequence)."""
    segments = min(NT, target // programs) if programs > 0 else 1
    if segments <= 1:
        return NT
    return triton.cdiv(NT, segments)


def chunk_fwd_fused(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor | None, gate: int,
    A: torch.Tensor | None, h0: torch.Tensor | None, output_final_state: bool, scale: float,
    chunk_size: int, store_states: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(o, h, ht): the outputs and states of chunk_fwd_states + chunk_fwd_output in one pass.

    q, k: [B, T, H, K] with K <= 128; v: [B, T, H, V]; gamma: cumulative log2-gates
    ([B, T, H] or [B, T, H, K] fp32) or None; A: [B, T, H, BT] fp32 for a vector gate, else
    None; h0: [B, H, K, V] fp32 or None. Returns o [B, T, H, V] in v's dtype, the states
    entering each chunk h [B, H, NT, K, V] in k's dtype (None with store_states=False: in
    inference nothing needs them, and not writing them saves B*H*NT*K*V values of traffic)
    and the final state [B, H, K, V] fp32 (or None).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    if K > MAX_K:
        raise ValueError(f"chunk_fwd_fused: K = {K} > {MAX_K}; use chunk_fwd_states + chunk_fwd_output")
    if gate == GATE_VECTOR and A is None:
        raise ValueError("chunk_fwd_fused: a vector gate needs its intra-chunk matrix A")
    NT = triton.cdiv(T, chunk_size)
    cfg = fused_launch(gate)
    BK = max(16, triton.next_power_of_2(K))
    target = segment_target(B * H, gate)
    if target > 0:  # segments bring the parallelism: keep the widest V-block
        BV = block_size(V, cfg.BV)
    else:
        _, BV = sequential_blocks(cfg, K, V, B * H, k.device)
    CPS = chunks_per_segment(NT, B * H * triton.cdiv(V, BV), target)
    S = triton.cdiv(NT, CPS)
    h_in = h0
    if S > 1:  # the state entering each segment (segments.py)
        h_in = segment_entry_states(k, v, gamma, gate, h0, chunk_size, CPS, BV, dot_precision(q.dtype, cfg.fp32_dots),
                                    cfg.num_warps, cfg.decay_on_v)
    o = new_buffer((B, T, H, V), v.dtype, v.device)
    # without stored states, k stands in for h's pointer (same dtype: the kernel rounds the
    # state it uses to it, as the two-kernel path reads it back)
    h = new_buffer((B, H, NT, K, V), k.dtype, k.device) if store_states else None
    ht = new_buffer((B, H, K, V), torch.float32, k.device) if output_final_state else None
    grid = (triton.cdiv(V, BV), B * H, S)
    chunk_fwd_fused_kernel[grid](
        q, k, v, gamma if gamma is not None else q, A if A is not None else q, h_in if h_in is not None else o,
        h if h is not None else k, ht if ht is not None else o, o, scale, T, NT, CPS, S, H=H, K=K, V=V,
        BT=chunk_size, BK=BK, BV=BV, GATE=gate, HAS_A=A is not None, HAS_IN=h_in is not None,
        STORE_H=store_states, STORE_HT=output_final_state,
        DOT_PREC=dot_precision(q.dtype, cfg.fp32_dots), DECAY_ON_V=cfg.decay_on_v_for(K),
        num_warps=warps(cfg.num_warps), num_stages=cfg.stages_for(K),
    )
    return o, h, ht
