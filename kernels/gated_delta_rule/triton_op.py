"""Triton backend of the gated delta rule (and, with no gate, of the delta rule).

    gated_delta_rule_triton(q, k, v, g, beta, scale=..., initial_state=None,
                            output_final_state=False, chunk_size=64) -> (o, final_state)

Forward: wy_fwd (triton_wy.py) -> state_fwd -> output_fwd (triton_fwd.py).
Backward: du_local -> state_bwd (triton_bwd.py) -> dqkw (triton_bwd_grad.py) -> wy_bwd
(triton_wy_bwd.py), reusing the forward's Tm, W, U and per-chunk states.

Why store the per-chunk states instead of recomputing them in the backward (as
flash-linear-attention does): recomputation re-runs W/U0 and the sequential state pass (two
launches, one sequential over chunks, ~25% of a forward), while storing costs
NT * K * V values per head, i.e. 2 * K * V / 64 bytes per token and head in 16-bit (512 B at
K = V = 128, twice the size of q). The benchmark (benchmarks/bench_delta.py) records the
peak memory next to the times.

Keys need not be unit norm: the transition I - beta k k^T is a contraction, and the
chunk's (I + A)^{-1} well conditioned, while beta ||k||^2 <= 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.gated_delta_rule.triton_bwd import du_local, state_bwd
from kernels.gated_delta_rule.triton_bwd_grad import dqkw
from kernels.gated_delta_rule.triton_fwd import fused_output_applies, output_fwd, state_fwd
from kernels.gated_delta_rule.triton_tuning import CHUNK
from kernels.gated_delta_rule.triton_wy import wy_fwd
from kernels.gated_delta_rule.triton_wy_bwd import wy_bwd

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class DeltaOptions:
    """Non-tensor arguments of one call: the query scale and whether to return the final state."""

    scale: float
    output_final_state: bool


class ChunkDeltaRuleFunction(torch.autograd.Function):
    """(o, final_state) = gated delta rule; g None means the ungated delta rule."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, opts: DeltaOptions):
        h0 = initial_state.float().contiguous() if initial_state is not None else None
        gam, tm, w, u0 = wy_fwd(k, v, beta, g)
        fused = fused_output_applies(q.shape[0] * q.shape[2])
        h, u, ht, o = state_fwd(k, w, u0, gam, h0, opts.output_final_state, q if fused else None, opts.scale)
        del u0
        if not fused:
            o = output_fwd(q, k, u, h, gam, opts.scale)
        ctx.save_for_backward(q, k, v, beta, gam, tm, w, u, h)
        ctx.opts = opts
        ctx.g_dtype = g.dtype if g is not None else None
        ctx.h0_dtype = initial_state.dtype if initial_state is not None else None
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, beta, gam, tm, w, u, h = ctx.saved_tensors
        opts = ctx.opts
        do = do.to(q.dtype).contiguous()
        dht = dht.float().contiguous() if dht is not None else None
        du = du_local(q, k, do, gam, opts.scale)
        dh, dh0 = state_bwd(q, k, w, do, du, gam, dht, opts.scale, ctx.h0_dtype is not None)
        dq, dk_part, dw, dgam_part = dqkw(q, k, u, h, dh, do, du, gam, opts.scale)
        del dh
        dk, dv, dbeta, dg = wy_bwd(k, v, beta, gam, tm, dw, du, dk_part, dgam_part, ctx.g_dtype)
        if dh0 is not None:
            dh0 = dh0.to(ctx.h0_dtype)
        return dq, dk, dv, dg, dbeta, dh0, None


def check_triton_inputs(op: str, q: torch.Tensor, v: torch.Tensor, chunk_size: int) -> None:
    """What the Triton kernels support beyond the op contract, as ValueErrors."""
    if q.dtype not in TRITON_DTYPES:
        raise ValueError(f"{op}: backend='triton' takes float16, bfloat16, float32 or float64 inputs, got {q.dtype}")
    if chunk_size != CHUNK:
        raise ValueError(f"{op}: backend='triton' needs chunk_size={CHUNK}, got {chunk_size!r}")
    K, V = q.shape[-1], v.shape[-1]
    if K > MAX_HEAD_DIM or V > MAX_HEAD_DIM:
        raise ValueError(
            f"{op}: backend='triton' supports K, V <= {MAX_HEAD_DIM}, got K={K}, V={V}"
        )


def chunk_delta_rule_triton(
    op: str, q, k, v, g, beta, scale: float, initial_state, output_final_state: bool, chunk_size: int,
):
    """Shared entry of delta_rule / gated_delta_rule (g None for the former); inputs validated
    by the public op. Returns (o [B, T, H, V] in q's dtype, final state fp32 or None).
    float64 inputs are computed in float32 (the kernels' widest type) and returned as float64,
    final state included."""
    check_triton_inputs(op, q, v, chunk_size)
    input_dtype = q.dtype
    dt = torch.float32 if q.dtype == torch.float64 else q.dtype
    q, k, v = q.to(dt).contiguous(), k.to(dt).contiguous(), v.to(dt).contiguous()
    beta = beta.contiguous()
    g = g.contiguous() if g is not None else None
    opts = DeltaOptions(scale=float(scale), output_final_state=bool(output_final_state))
    o, ht = ChunkDeltaRuleFunction.apply(q, k, v, g, beta, initial_state, opts)
    if input_dtype == torch.float64:
        o, ht = o.double(), (ht.double() if ht is not None else None)
    return o, (ht if output_final_state else None)


def gated_delta_rule_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    scale: float, initial_state: torch.Tensor | None = None, output_final_state: bool = False,
    chunk_size: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule on Triton. q, k: [B, T, H, K]; v: [B, T, H, V]; g (log decay, <= 0),
    beta: [B, T, H]; initial_state [B, H, K, V] or None. Arguments are already validated by
    kernels.gated_delta_rule.gated_delta_rule. Returns (o [B, T, H, V] in q's dtype,
    final state [B, H, K, V] fp32 or None); differentiable in q, k, v, g, beta, initial_state."""
    return chunk_delta_rule_triton(
        "gated_delta_rule", q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size
    )
