"""The delta rules' dq/dk/dW kernel and WY backward as one kernel (DqkwLaunch.fuse_wy_bwd).

Each program takes one chunk of one sequence of heads (grid: chunks x heads, the heads first
by DeltaLaunch.heads_first_at) and runs what the two launches do for it, in order:
    dqkw_chunk    (triton_bwd_grad.py, the k-loop form) dq; dk's share from the output and
                  the state, dW and the d gamma shares into scratch tensors
    barrier       every thread's part of those is written before any thread reads it
    wy_bwd_chunk  (triton_wy_bwd.py) dk, dv, dbeta and dg from them
The scratch rows are the program's own and read back while they are likely still in L2, and
k and dU, which both halves read, are read from memory once: at K = V = 128, B·T = 65,536,
H = 16 the two launches read about 1 GB more from memory (dW and dk's share read back, k and
dU read twice); the scratch rows are written either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.triton.utils import block_size, chunk_and_head, chunk_grid, dot_precision, warps
from kernels.gated_delta_rule.triton_bwd_grad import dqkw_buffers, dqkw_chunk
from kernels.gated_delta_rule.triton_wy import CHUNK, delta_launch
from kernels.gated_delta_rule.triton_wy_bwd import wy_bwd_buffers, wy_bwd_chunk


@triton.jit(do_not_specialize=["T", "NT", "BTH"])
def dqkw_wy_bwd_kernel(
    q, k, u, v, beta, gam, tm, h, dh, do, du, dq, dk_part, dw, dgam, dk, dv, dbeta, dg, dm_scratch, scale,
    T, NT, BTH, H,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    WY_BK: tl.constexpr, WY_BV: tl.constexpr, USE_G: tl.constexpr, NEED_DG: tl.constexpr, PREC: tl.constexpr,
    DM_READBACK: tl.constexpr, HEADS_FIRST: tl.constexpr,
):
    i_t, i_bh = chunk_and_head(0, HEADS_FIRST)
    dqkw_chunk(q, k, u, h, dh, do, du, gam, dq, dk_part, dw, dgam, scale, i_t, i_bh, T, NT, BTH, H,
               K, V, BT, BK, BV, USE_G, NEED_DG, PREC)
    tl.debug_barrier()
    wy_bwd_chunk(k, v, beta, gam, tm, dw, du, dk_part, dgam, dk, dv, dbeta, dg, dm_scratch, i_t, i_bh,
                 T, BTH, 1, H, K, V, BT, WY_BK, WY_BV, USE_G, NEED_DG, PREC, DM_READBACK)


def fused_wy_bwd_applies(gated: bool, V: int) -> bool:
    """Whether the backward runs dqkw and wy_bwd as dqkw_wy_bwd_kernel at value dim V: where
    DqkwLaunch.fuse_wy_bwd is set (under the launch settings in effect) and V is at least 64.
    The fused kernel runs dqkw's warps, and wy_bwd under V-blocks narrower than 64 takes 2
    warps, because 4 miscompile it there (NarrowVLaunch)."""
    return delta_launch(gated).dqkw.fuse_wy_bwd and V >= 64


def dqkw_wy_bwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, gam: torch.Tensor | None,
    tm: torch.Tensor, u: torch.Tensor, h: torch.Tensor, dh: torch.Tensor, do: torch.Tensor, du: torch.Tensor,
    scale: float, g_dtype: torch.dtype | None, need_dg: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """dqkw then wy_bwd (their docstrings give the shapes) in one launch. q, k: [B, T, H, K];
    v, u, do, du: [B, T, H, V]; beta: [B, T, H]; gam: [B, T, H] fp32 log2 units or None; tm:
    [B, T, H, 64]; h, dh: [B, H, NT, K, V]. Returns (dq [B, T, H, K] q.dtype, dk k.dtype, dv
    [B, T, H, V] v.dtype, dbeta [B, T, H] beta.dtype, dg [B, T, H] g_dtype or None without a gate
    or with need_dg False). fused_wy_bwd_applies must hold; the dots of both halves take
    dqkw's precision (DqkwLaunch.fp32_dots)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if not fused_wy_bwd_applies(gam is not None, V):
        raise ValueError(f"dqkw_wy_bwd: needs DqkwLaunch.fuse_wy_bwd on and V >= 64 (got V = {V}); "
                         "run dqkw then wy_bwd otherwise")
    BT = CHUNK
    NT = triton.cdiv(T, BT)
    launch = delta_launch(gam is not None)
    cfg, wy_cfg = launch.dqkw, launch.wy_bwd
    need_dg = need_dg and gam is not None
    dq, dk_part, dw, dgam = dqkw_buffers(q, k, cfg.dk_part_16bit, 1 if need_dg else 0)
    dk, dv, dbeta, dg, dm_scratch = wy_bwd_buffers(k, v, beta, g_dtype if need_dg else None, BT, wy_cfg.dm_readback)
    heads_first = launch.heads_first_at(NT)
    dqkw_wy_bwd_kernel[chunk_grid((), NT, B * H, heads_first, "dqkw_wy_bwd")](
        q, k, u, v, beta, gam if gam is not None else q, tm, h, dh, do, du, dq, dk_part, dw,
        dgam if dgam is not None else q, dk, dv, dbeta, dg if dg is not None else q, dm_scratch, scale,
        T, NT, B * T * H,
        H=H, K=K, V=V, BT=BT, BK=block_size(K, cfg.BK), BV=block_size(V, cfg.block_v_for(K)),
        WY_BK=block_size(K, wy_cfg.BK), WY_BV=block_size(V, wy_cfg.BV), USE_G=gam is not None, NEED_DG=need_dg,
        PREC=dot_precision(q.dtype, cfg.fp32_dots), DM_READBACK=wy_cfg.dm_readback, HEADS_FIRST=heads_first,
        num_warps=warps(cfg.num_warps), num_stages=cfg.num_stages,
    )
    return dq, dk, dv, dbeta, dg
