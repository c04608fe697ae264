"""Backward state passing of the (gated) delta rule (docs/design.md §10), chunk C = 64.

With P = (scale Q K^T ⊙ Gamma) (lower, diagonal included), Kd = K ⊙ e^{gamma_C - gamma} and
dS_{n+1} the gradient of the state leaving chunk n (dS_N = gradient of the final state):

  du_local   grid (V-blocks, chunks, heads), in parallel:   dU_local = P^T dO
  state_bwd  grid (V-blocks, heads), chunks in reverse order, dS in fp32 registers:
                 store dS_{n+1};  dU = dU_local + Kd dS_{n+1} (stored over dU_local)
                 dS_n = e^{gamma_C} dS_{n+1} + scale (Q ⊙ e^gamma)^T dO - W^T dU
             and dS_0 is the gradient of the initial state.

P^T is computed directly as K Q^T (never as the transpose of a product: see
kernels/common/triton/solve.py on Hopper). Layouts as in triton_fwd.py; dh: [B, H, NT, K, V].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.triton.utils import new_buffer, warps
from kernels.gated_delta_rule.triton_tiles import anticausal_decay, load_gamma, load_tile, load_tile_t, store_tile
from kernels.gated_delta_rule.triton_tuning import CHUNK, TUNING, dot_prec, full_width, pow2, seq_block_v


@triton.jit(do_not_specialize=["T"])
def du_local_kernel(
    q, k, do, gam, du, scale, T, H,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, PREC: tl.constexpr,
):
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    seq = (i_b * T * H + i_h).to(tl.int64)
    t0, v0 = i_t * 64, i_v * BV
    # b_pt[a, b] = k_a . q_b, kept where query b >= key a
    b_pt = tl.zeros([64, 64], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_k = load_tile(k + seq * K, t0, T, H * K, i_k * BK, K, 64, BK)
        b_qt = load_tile_t(q + seq * K, t0, T, H * K, i_k * BK, K, BK, 64)
        b_pt += tl.dot(b_k, b_qt, input_precision=PREC)
    b_g = tl.zeros([64], dtype=tl.float32)
    if USE_G:
        b_g = load_gamma(gam + seq, t0, T, H, 64)
    b_pt = anticausal_decay(b_pt * scale, b_g, b_g, True, USE_G)
    b_do = load_tile(do + seq * V, t0, T, H * V, v0, V, 64, BV)
    b_du = tl.dot(b_pt.to(b_do.dtype), b_do, input_precision=PREC)
    store_tile(du + seq * V, b_du, t0, T, H * V, v0, V, 64, BV)


@triton.jit(do_not_specialize=["T", "NT"])
def state_bwd_kernel(
    q, k, w, do, du, gam, dh, dht, dh0, scale, T, NT, H,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr, PREC: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    seq = (i_b * T * H + i_h).to(tl.int64)
    v0 = i_v * BV
    dt = k.dtype.element_ty
    b_ds = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_DHT:
        b_ds += load_tile(dht + i_bh.to(tl.int64) * K * V, 0, K, V, v0, V, BK, BV)
    for j in range(NT):
        i_t = NT - 1 - j
        t0 = i_t * 64
        store_tile(dh + (i_bh * NT + i_t).to(tl.int64) * K * V, b_ds, 0, K, V, v0, V, BK, BV)
        b_k = load_tile(k + seq * K, t0, T, H * K, 0, K, 64, BK)
        b_qt = load_tile_t(q + seq * K, t0, T, H * K, 0, K, BK, 64)
        b_wt = load_tile_t(w + seq * K, t0, T, H * K, 0, K, BK, 64)
        b_do = load_tile(do + seq * V, t0, T, H * V, v0, V, 64, BV)
        b_du = load_tile(du + seq * V, t0, T, H * V, v0, V, 64, BV).to(tl.float32)
        if USE_G:
            last = tl.minimum(t0 + 64, T) - 1
            b_glast = tl.load(gam + seq + last * H)
            b_g = load_gamma(gam + seq, t0, T, H, 64)
            b_k = (b_k * tl.exp(b_glast - b_g)[:, None]).to(dt)
            b_qt = (b_qt * (scale * tl.exp(b_g))[None, :]).to(dt)
        else:
            b_qt = (b_qt * scale).to(dt)
        b_ds_c = b_ds.to(dt)
        b_du += tl.dot(b_k, b_ds_c, input_precision=PREC)
        b_du_c = b_du.to(dt)
        store_tile(du + seq * V, b_du_c, t0, T, H * V, v0, V, 64, BV)
        if USE_G:
            b_ds *= tl.exp(b_glast)
        b_ds += tl.dot(b_qt, b_do, input_precision=PREC)
        b_ds -= tl.dot(b_wt, b_du_c, input_precision=PREC)
    if STORE_DH0:
        store_tile(dh0 + i_bh.to(tl.int64) * K * V, b_ds, 0, K, V, v0, V, BK, BV)


def du_local(
    q: torch.Tensor, k: torch.Tensor, do: torch.Tensor, gam: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """dU_local = P^T dO per chunk: [B, T, H, V] in do's dtype."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    du = new_buffer((B, T, H, V), do.dtype, do.device)
    cfg = TUNING["du_local"]
    BV = pow2(V, cfg["BV"])
    du_local_kernel[(triton.cdiv(V, BV), triton.cdiv(T, CHUNK), B * H)](
        q, k, do, gam if gam is not None else q, du, scale, T,
        H=H, K=K, V=V, BK=pow2(K, cfg["BK"]), BV=BV, USE_G=gam is not None,
        PREC=dot_prec(q.dtype), num_warps=warps(cfg["num_warps"]), num_stages=cfg["num_stages"],
    )
    return du


def state_bwd(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, do: torch.Tensor, du: torch.Tensor,
    gam: torch.Tensor | None, dht: torch.Tensor | None, scale: float, need_dh0: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Turns du (holding dU_local) into dU in place; returns (dh [B, H, NT, K, V] gradients of
    the states leaving each chunk, dh0 [B, H, K, V] fp32 or None). dht: fp32 or None."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    dev = q.device
    dh = new_buffer((B, H, NT, K, V), q.dtype, dev)
    dh0 = new_buffer((B, H, K, V), torch.float32, dev) if need_dh0 else None
    cfg = TUNING["state_bwd"]
    BV = seq_block_v(V, B * H, dev, cfg["BV"])
    state_bwd_kernel[(triton.cdiv(V, BV), B * H)](
        q, k, w, do, du, gam if gam is not None else q, dh, dht if dht is not None else q,
        dh0 if dh0 is not None else q, scale, T, NT,
        H=H, K=K, V=V, BK=full_width(K), BV=BV, USE_G=gam is not None, HAS_DHT=dht is not None,
        STORE_DH0=need_dh0, PREC=dot_prec(q.dtype),
        num_warps=warps(cfg["num_warps"]), num_stages=cfg["num_stages"],
    )
    return dh, dh0
