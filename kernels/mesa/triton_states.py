"""MesaNet's two states across chunks (docs/design.md §8, §10), forward and backward, in Triton.

Forward, for the K x K state (B = K) and the K x V state (B = V) alike, chunk by chunk:
    S_{n+1} = c_n S_n + (K_n ⊙ u)^T B_n,   u_j = beta_j e^{g_{j+1} + ... + g_C},  c_n = e^{g_1 + ... + g_C}
`mesa_fwd_states` stores S_n, the state entering chunk n, for every chunk (fp32).

Backward: with dS_N the gradient of the final state, chunk by chunk from the last,
    dS_n = c_n dS_{n+1} + coef (A_n ⊙ d)^T B_n,     d_i = e^{g_1 + ... + g_i}
where the per-chunk term is the gradient that chunk's outputs send to the state entering
it: A = Q*, B = dO, coef = +1 for the K x V state (o_i = d_i S_n^T q*_i + ...), and A = Y
(the adjoint solution), B = Q*, coef = -1 for the K x K state (dM_i = -y_i q*_i^T).
`mesa_bwd_states` stores dS_{n+1}, the gradient of the state leaving chunk n, returns dS_0
(the initial state's gradient) and, per chunk, c_n <S_n, dS_{n+1}>: the gradient of the
chunk decay c_n, which every log-gate of the chunk receives.

Layouts: k, a: [B, T, H, KA]; b: [B, T, H, D]; g, beta: [B, T, H]; per-chunk states
[B, H, NT, KA, D] fp32; initial/final states [B, H, KA, D] fp32. Each program owns one
(row block, column block) of one head's state and walks the chunks in order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.launch import StateLaunch
from kernels.common.triton.gates import log2_gates
from kernels.common.triton.tiles import load_tile, load_tile_t, store_tile
from kernels.common.triton.utils import multiprocessors, new_buffer, warps
from kernels.mesa.triton_system import load_gates


@triton.jit
def _later_gates(g, seq, t0, T, H, BT: tl.constexpr):
    """exp(g_{j+1} + ... + g_C) for every token j of a chunk, [BT] (C: the chunk's last token,
    or T's), by a reverse running sum of the gates shifted one token: O(BT) adds per chunk
    where the masked [BT, BT] sum cost BT^2, and no subtraction (no cancellation)."""
    o_next = t0 + 1 + tl.arange(0, BT)
    m_next = (o_next < T) & (o_next < t0 + BT)
    b_next = log2_gates(tl.load(g + seq + o_next * H, mask=m_next, other=0.0))
    return tl.exp2(tl.cumsum(b_next, axis=0, reverse=True))


@triton.jit(do_not_specialize=["T", "NT", "H"])
def mesa_fwd_states_kernel(
    k, b, g, beta, h0, h, ht, T, NT,
    H, K: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr,
    HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, PREC: tl.constexpr,
):
    i_k, i_d, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    b_h = tl.zeros([BK, BD], dtype=tl.float32)
    if HAS_H0:
        b_h += load_tile(h0 + i_bh.to(tl.int64) * K * D, i_k * BK, i_d * BD, K, D, D, BK, BD)
    for i_t in range(NT):
        t0 = i_t * BT
        store_tile(h + (i_bh * NT + i_t).to(tl.int64) * K * D, b_h, i_k * BK, i_d * BD, K, D, D, BK, BD)
        b_g, b_beta = load_gates(g, beta, seq, t0, T, H, BT)
        b_chunk_decay = tl.exp2(tl.sum(b_g))
        b_u = b_beta * _later_gates(g, seq, t0, T, H, BT)
        b_kt = load_tile_t(k + seq * K, t0, i_k * BK, T, K, H * K, BT, BK).to(tl.float32)  # [BK, BT]
        b_b = load_tile(b + seq * D, t0, i_d * BD, T, D, H * D, BT, BD).to(tl.float32)
        b_h = b_h * b_chunk_decay + tl.dot(b_kt * b_u[None, :], b_b, input_precision=PREC)
    if STORE_HT:
        store_tile(ht + i_bh.to(tl.int64) * K * D, b_h, i_k * BK, i_d * BD, K, D, D, BK, BD)


@triton.jit(do_not_specialize=["T", "NT", "H"])
def mesa_bwd_states_kernel(
    a, b, g, state, dht, dstate, dstate0, decay_grad, coef, T, NT,
    H, K: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr,
    HAS_DHT: tl.constexpr, STORE_D0: tl.constexpr, PREC: tl.constexpr,
):
    i_k, i_d, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = i_b.to(tl.int64) * T * H + i_h
    n_blocks = tl.num_programs(0) * tl.num_programs(1)
    o_i = tl.arange(0, BT)
    b_dh = tl.zeros([BK, BD], dtype=tl.float32)
    if HAS_DHT:
        b_dh += load_tile(dht + i_bh.to(tl.int64) * K * D, i_k * BK, i_d * BD, K, D, D, BK, BD)
    for i_s in range(NT):
        i_t = NT - 1 - i_s
        t0 = i_t * BT
        chunk = (i_bh * NT + i_t).to(tl.int64)
        store_tile(dstate + chunk * K * D, b_dh, i_k * BK, i_d * BD, K, D, D, BK, BD)
        o_t = t0 + o_i
        b_g = log2_gates(tl.load(g + seq + o_t * H, mask=o_t < T, other=0.0))
        b_chunk_decay = tl.exp2(tl.sum(b_g))
        # this block's share of c_n <S_n, dS_{n+1}>; shares of all blocks are summed later
        b_s = load_tile(state + chunk * K * D, i_k * BK, i_d * BD, K, D, D, BK, BD)
        block = i_k * tl.num_programs(1) + i_d
        tl.store(decay_grad + chunk * n_blocks + block, b_chunk_decay * tl.sum(b_s * b_dh))
        b_d = tl.exp2(tl.cumsum(b_g, axis=0))  # e^{g_1 + ... + g_i}
        b_at = load_tile_t(a + seq * K, t0, i_k * BK, T, K, H * K, BT, BK).to(tl.float32)  # [BK, BT]
        b_b = load_tile(b + seq * D, t0, i_d * BD, T, D, H * D, BT, BD).to(tl.float32)
        b_dh = b_dh * b_chunk_decay + coef * tl.dot(b_at * b_d[None, :], b_b, input_precision=PREC)
    if STORE_D0:
        store_tile(dstate0 + i_bh.to(tl.int64) * K * D, b_dh, i_k * BK, i_d * BD, K, D, D, BK, BD)


def _blocks(K: int, D: int, BH: int, device: torch.device, launch: StateLaunch) -> tuple[int, int]:
    """Row and column blocks of a state (StateLaunch: the column block narrows while there
    would be too few programs per multiprocessor)."""
    BK = max(16, min(launch.max_BK, triton.next_power_of_2(K)))
    BD = max(16, min(launch.max_BD, triton.next_power_of_2(D)))
    sms = multiprocessors(device)
    if sms is not None:
        while BD > launch.min_BD and BH * triton.cdiv(K, BK) * triton.cdiv(D, BD) < launch.min_programs * sms:
            BD //= 2
    return BK, BD


def mesa_fwd_states(
    k: torch.Tensor, b: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, h0: torch.Tensor | None,
    output_final_state: bool, chunk_size: int, prec: str, launch: StateLaunch = StateLaunch(),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """States entering each chunk, h: [B, H, NT, K, D] fp32, and the final state [B, H, K, D]
    fp32 (None unless output_final_state). k: [B, T, H, K]; b: [B, T, H, D] (k itself for
    H_kk, v for H_kv); g, beta: [B, T, H]; h0: [B, H, K, D] fp32 or None."""
    B, T, H, K = k.shape
    D = b.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    BK, BD = _blocks(K, D, B * H, k.device, launch)
    h = new_buffer((B, H, NT, K, D), torch.float32, k.device)
    ht = new_buffer((B, H, K, D), torch.float32, k.device) if output_final_state else None
    grid = (triton.cdiv(K, BK), triton.cdiv(D, BD), B * H)
    mesa_fwd_states_kernel[grid](
        k, b, g, beta, h0 if h0 is not None else h, h, ht if ht is not None else h, T, NT,
        H=H, K=K, D=D, BT=chunk_size, BK=BK, BD=BD, HAS_H0=h0 is not None, STORE_HT=output_final_state,
        PREC=prec, num_warps=warps(launch.num_warps), num_stages=launch.num_stages,
    )
    return h, ht


def mesa_bwd_states(
    a: torch.Tensor, b: torch.Tensor, g: torch.Tensor, state: torch.Tensor, dht: torch.Tensor | None,
    coef: float, need_d0: bool, chunk_size: int, prec: str, launch: StateLaunch = StateLaunch(),
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Gradients of one state. a: [B, T, H, K]; b: [B, T, H, D]; g: [B, T, H]; state: the
    forward states entering each chunk [B, H, NT, K, D] fp32; dht: [B, H, K, D] or None.

    Returns dstate [B, H, NT, K, D] fp32 (gradient of the state leaving chunk n), dstate0
    [B, H, K, D] fp32 (None unless need_d0) and decay_grad [B, H, NT] fp32 = c_n <S_n, dS_{n+1}>."""
    B, T, H, K = a.shape
    D = b.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    BK, BD = _blocks(K, D, B * H, a.device, launch)
    grid = (triton.cdiv(K, BK), triton.cdiv(D, BD), B * H)
    dstate = new_buffer((B, H, NT, K, D), torch.float32, a.device)
    dstate0 = new_buffer((B, H, K, D), torch.float32, a.device) if need_d0 else None
    decay_grad = new_buffer((B, H, NT, grid[0] * grid[1]), torch.float32, a.device)
    mesa_bwd_states_kernel[grid](
        a, b, g, state, dht.float().contiguous() if dht is not None else dstate, dstate,
        dstate0 if dstate0 is not None else dstate, decay_grad, float(coef), T, NT,
        H=H, K=K, D=D, BT=chunk_size, BK=BK, BD=BD, HAS_DHT=dht is not None, STORE_D0=need_d0,
        PREC=prec, num_warps=warps(launch.num_warps), num_stages=launch.num_stages,
    )
    return dstate, dstate0, decay_grad.sum(-1)
