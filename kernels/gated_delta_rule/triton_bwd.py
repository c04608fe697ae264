"""Backward state passing of the (gated) delta rule (docs/design.md §10), chunks of BT tokens.

With P = (scale Q K^T ⊙ Gamma) (lower, diagonal included), Kd = K ⊙ 2^{gamma_C - gamma} and
dS_{n+1} the gradient of the state leaving chunk n (dS_N = gradient of the final state):

  du_local   grid (V-blocks, chunks, heads), in parallel:   dU_local = P^T dO
  state_bwd  grid (V-blocks, heads), chunks in reverse order, dS in fp32 registers:
                 store dS_{n+1};  dU = dU_local + Kd dS_{n+1} (stored over dU_local,
                 or, with LOCAL_DU, with dU_local formed here from the k, q and dO
                 tiles the pass loads: StateBwdLaunch.local_du)
                 dS_n = 2^{gamma_C} dS_{n+1} + scale (Q ⊙ 2^gamma)^T dO - W^T dU
             and dS_0 is the gradient of the initial state. The row factors 2^gamma and
             2^{gamma_C - gamma} multiply q's and k's tiles, or (StateBwdLaunch.factors_on_v,
             where dU_local comes from du_local) the dO tile and the product
             Kd dS = diag(2^{gamma_C - gamma}) (K dS).

P^T is computed directly as K Q^T (never as the transpose of a product: see
kernels/common/triton/solve.py on Hopper), or, where the forward kept P (DeltaLaunch.keeps_p),
loaded transposed from it. Layouts as in triton_fwd.py (gamma in log2
units); dh: [B, H, NT, K, V].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.triton import utils
from kernels.common.triton.gates import anticausal_decay
from kernels.common.triton.tiles import chunk_gram, load_gamma_rows, load_tile, load_tile_t, store_tile
from kernels.common.triton.utils import block_size, dot_precision, full_block, new_buffer, sequential_block_v, warps
from kernels.gated_delta_rule.triton_wy import CHUNK, delta_launch


@triton.jit(do_not_specialize=["T"])
def du_local_kernel(
    q, k, do, gam, pm, du, scale, T, H,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, PREC: tl.constexpr, HEADS_FIRST: tl.constexpr, P_STORED: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_t, i_bh = utils.chunk_and_head(1, HEADS_FIRST)
    i_b, i_h = i_bh // H, i_bh % H
    seq = (i_b * T * H + i_h).to(tl.int64)
    t0, v0 = i_t * BT, i_v * BV
    if P_STORED:  # the forward's P, read transposed
        b_pt = load_tile_t(pm + seq * BT, t0, 0, T, BT, H * BT, BT, BT)
    else:
        # b_pt[a, b] = k_a . q_b, kept where query b >= key a
        b_pt = chunk_gram(k, q, seq, t0, T, H, K, BT, BK, PREC)
        b_g = tl.zeros([BT], dtype=tl.float32)
        if USE_G:
            b_g = load_gamma_rows(gam + seq, t0, T, H, BT)
        b_pt = anticausal_decay(b_pt * scale, b_g, b_g, True, USE_G)
    b_do = load_tile(do + seq * V, t0, v0, T, V, H * V, BT, BV)
    b_du = tl.dot(b_pt.to(b_do.dtype), b_do, input_precision=PREC)
    store_tile(du + seq * V, b_du, t0, v0, T, V, H * V, BT, BV)


@triton.jit(do_not_specialize=["T", "NT"])
def state_bwd_kernel(
    q, k, w, do, du, gam, pm, dh, dht, dh0, scale, T, NT, H,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr, LOCAL_DU: tl.constexpr,
    FACTORS_ON_V: tl.constexpr, PREC: tl.constexpr, P_STORED: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    seq = (i_b * T * H + i_h).to(tl.int64)
    v0 = i_v * BV
    dt = k.dtype.element_ty
    b_ds = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_DHT:
        b_ds += load_tile(dht + i_bh.to(tl.int64) * K * V, 0, v0, K, V, V, BK, BV)
    for j in range(NT):
        i_t = NT - 1 - j
        t0 = i_t * BT
        store_tile(dh + (i_bh * NT + i_t).to(tl.int64) * K * V, b_ds, 0, v0, K, V, V, BK, BV)
        b_k = load_tile(k + seq * K, t0, 0, T, K, H * K, BT, BK)
        b_qt = load_tile_t(q + seq * K, t0, 0, T, K, H * K, BT, BK)
        b_wt = load_tile_t(w + seq * K, t0, 0, T, K, H * K, BT, BK)
        b_do = load_tile(do + seq * V, t0, v0, T, V, H * V, BT, BV)
        b_g = tl.zeros([BT], dtype=tl.float32)
        if USE_G:
            last = tl.minimum(t0 + BT, T) - 1
            b_glast = tl.load(gam + seq + last * H)
            b_g = load_gamma_rows(gam + seq, t0, T, H, BT)
        if LOCAL_DU:  # dU_local = P^T dO, P^T from the ungated tiles (as du_local_kernel) or stored
            if P_STORED:
                b_pt = load_tile_t(pm + seq * BT, t0, 0, T, BT, H * BT, BT, BT)
            else:
                b_pt = anticausal_decay(tl.dot(b_k, b_qt, input_precision=PREC) * scale, b_g, b_g, True, USE_G)
            b_du = tl.dot(b_pt.to(dt), b_do, input_precision=PREC)
        else:
            b_du = load_tile(du + seq * V, t0, v0, T, V, H * V, BT, BV).to(tl.float32)
        b_ds_c = b_ds.to(dt)
        if FACTORS_ON_V:  # the row factors on [BT, BV] tiles: dO before its product, Kd dS after
            b_kds = tl.dot(b_k, b_ds_c, input_precision=PREC)
            if USE_G:
                b_do_f = (b_do * (scale * tl.exp2(b_g))[:, None]).to(dt)
                b_du += b_kds * tl.exp2(b_glast - b_g)[:, None]
            else:
                b_do_f = (b_do * scale).to(dt)
                b_du += b_kds
        else:
            if USE_G:
                b_k = (b_k * tl.exp2(b_glast - b_g)[:, None]).to(dt)
                b_qt = (b_qt * (scale * tl.exp2(b_g))[None, :]).to(dt)
            else:
                b_qt = (b_qt * scale).to(dt)
            b_do_f = b_do
            b_du += tl.dot(b_k, b_ds_c, input_precision=PREC)
        b_du_c = b_du.to(dt)
        store_tile(du + seq * V, b_du_c, t0, v0, T, V, H * V, BT, BV)
        if USE_G:
            b_ds *= tl.exp2(b_glast)
        b_ds += tl.dot(b_qt, b_do_f, input_precision=PREC)
        b_ds -= tl.dot(b_wt, b_du_c, input_precision=PREC)
    if STORE_DH0:
        store_tile(dh0 + i_bh.to(tl.int64) * K * V, b_ds, 0, v0, K, V, V, BK, BV)


def du_local(
    q: torch.Tensor, k: torch.Tensor, do: torch.Tensor, gam: torch.Tensor | None, scale: float,
    chunk_size: int = CHUNK, p: torch.Tensor | None = None,
) -> torch.Tensor:
    """dU_local = P^T dO per chunk: [B, T, H, V] in do's dtype. q, k: [B, T, H, K]; do:
    [B, T, H, V]; gam: [B, T, H] fp32 cumulative log2-gates or None; p: the forward's P
    ([B, T, H, chunk_size] in q's dtype, output_fwd's), read instead of forming P from q
    and k, or None."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    du = new_buffer((B, T, H, V), do.dtype, do.device)
    launch = delta_launch(gam is not None)
    cfg = launch.du_local
    BV = block_size(V, cfg.BV)
    heads_first = launch.heads_first_at(triton.cdiv(T, chunk_size))
    grid = utils.chunk_grid((triton.cdiv(V, BV),), triton.cdiv(T, chunk_size), B * H, heads_first, "du_local")
    du_local_kernel[grid](
        q, k, do, gam if gam is not None else q, p if p is not None else q, du, scale, T,
        H=H, K=K, V=V, BT=chunk_size, BK=block_size(K, cfg.BK), BV=BV, USE_G=gam is not None,
        PREC=dot_precision(q.dtype, cfg.fp32_dots), HEADS_FIRST=heads_first, P_STORED=p is not None,
        num_warps=warps(cfg.warps_for(BV)),
        num_stages=cfg.num_stages,
    )
    return du


def local_du_fused(n_heads: int, K: int, gated: bool) -> bool:
    """Whether state_bwd forms dU_local itself for n_heads = B * H at head dim K
    (StateBwdLaunch.local_du, under the launch settings in effect), so that du_local need
    not run."""
    cfg = delta_launch(gated).state_bwd
    return cfg.local_du and n_heads >= cfg.min_heads and K <= cfg.max_K


def state_bwd(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, do: torch.Tensor, du: torch.Tensor | None,
    gam: torch.Tensor | None, dht: torch.Tensor | None, scale: float, need_dh0: bool,
    chunk_size: int = CHUNK, p: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """dU [B, T, H, V] in do's dtype from du (holding dU_local, from du_local; turned into dU
    in place) or, with du None, from dU_local formed in the pass (local_du_fused must hold),
    from the forward's P where p is given (as du_local's) and from q and k otherwise.
    Returns (dU, dh [B, H, NT, K, V] gradients of the states leaving each chunk, dh0
    [B, H, K, V] fp32 or None). dht: fp32 or None."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    dev = q.device
    local = du is None
    if local and not local_du_fused(B * H, K, gam is not None):
        raise ValueError("state_bwd: du None (dU_local formed in the pass) needs StateBwdLaunch.local_du on "
                         "for this many heads and this head dim; run du_local first otherwise")
    du = new_buffer((B, T, H, V), do.dtype, dev) if local else du
    dh = new_buffer((B, H, NT, K, V), q.dtype, dev)
    dh0 = new_buffer((B, H, K, V), torch.float32, dev) if need_dh0 else None
    launch = delta_launch(gam is not None)
    cfg = launch.state_bwd
    BV = sequential_block_v(V, cfg.BV, launch.seq.min_BV, launch.seq.min_waves, B * H, dev)
    state_bwd_kernel[(triton.cdiv(V, BV), B * H)](
        q, k, w, do, du, gam if gam is not None else q, p if p is not None else q, dh,
        dht if dht is not None else q, dh0 if dh0 is not None else q, scale, T, NT,
        H=H, K=K, V=V, BT=chunk_size, BK=full_block(K), BV=BV, USE_G=gam is not None, HAS_DHT=dht is not None,
        STORE_DH0=need_dh0, LOCAL_DU=local, FACTORS_ON_V=cfg.factors_on_v and not local,
        PREC=dot_precision(q.dtype, cfg.fp32_dots), P_STORED=local and p is not None,
        num_warps=warps(cfg.num_warps),
        num_stages=cfg.stages_at(full_block(K), q.element_size(), triton.cdiv(V, BV) * B * H, utils.multiprocessors(dev)),
    )
    return du, dh, dh0
