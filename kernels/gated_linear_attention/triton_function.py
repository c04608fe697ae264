"""The autograd Function behind the Triton backends of linear_attention and
gated_linear_attention (linear attention is the ungated case of the same chunk pipeline).

Forward:  gamma = chunk-local cumsum of g (log2 units)
          A     = vector-gate intra-chunk matrix          (triton_vector.py; vector gate only)
          h     = states entering each chunk              (triton_states.py)
          o     = (Q e^gamma) h + A V per chunk           (triton_output.py)
          or h and o in one sequential pass               (triton_fused_forward.py, K <= 128)
Backward: dh    = gradients of the states leaving each chunk, dh0
          dv    = A^T dO + (K e^{gamma_C - gamma}) dh (in the dq/dk kernel with ChunkLaunch.bwd_dqk.fuse_dv)
          dq, dk, dg: triton_grad_qk.py (none/scalar gate) or triton_vector.py
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.common.launch import launch_settings, note_launch
from kernels.common.triton.cumsum import chunk_local_cumsum
from kernels.common.triton.gates import GATE_NONE, GATE_SCALAR, GATE_VECTOR, LOG2E
from kernels.common.triton.utils import chunk_op
from kernels.gated_linear_attention.triton_fused_forward import chunk_fwd_fused, fused_forward_applies
from kernels.gated_linear_attention.triton_grad_qk import chunk_bwd_dqk
from kernels.gated_linear_attention.triton_output import chunk_bwd_dv, chunk_fwd_output
from kernels.gated_linear_attention.triton_states import chunk_bwd_states, chunk_fwd_states
from kernels.gated_linear_attention.triton_vector import gla_bwd_dqkg, gla_intra_A


@dataclass(frozen=True)
class ChunkOptions:
    """Non-tensor arguments of the chunk pipeline (validated by the caller). store_states:
    keep the states entering each chunk for the backward; False where no gradient is wanted
    (grad_wanted), which lets the fused forward skip writing them."""

    scale: float
    chunk_size: int
    output_final_state: bool
    store_states: bool = True


def grad_wanted(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd will want a backward through these inputs."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def gate_mode(g: torch.Tensor | None) -> int:
    if g is None:
        return GATE_NONE
    return GATE_VECTOR if g.dim() == 4 else GATE_SCALAR


class ChunkGatedLinearAttentionFunction(torch.autograd.Function):
    """(q, k, v, g | None, h0 | None, ChunkOptions) -> (o, final state | None).

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] or [B, T, H, K] log-gates or None;
    h0: [B, H, K, V] fp32 or None. All contiguous, q/k/v of one dtype (fp16, bf16, fp32).
    o: [B, T, H, V] in v's dtype; final state [B, H, K, V] fp32.

    The forward runs under the launch settings in effect for its op (linear_attention
    without a gate, else gated_linear_attention) and keeps them in ctx.launch; the
    backward runs under those, whichever thread autograd runs it on.
    """

    @staticmethod
    def forward(ctx, q, k, v, g, h0, opts: ChunkOptions):
        gate = gate_mode(g)
        ctx.launch = note_launch(chunk_op(gate))
        BT = opts.chunk_size
        gamma = chunk_local_cumsum(g, BT, scale=LOG2E) if g is not None else None
        A = gla_intra_A(q, k, gamma, opts.scale, BT) if gate == GATE_VECTOR else None
        if fused_forward_applies(q.shape[-1], q.shape[0] * q.shape[2], gate):
            o, h, ht = chunk_fwd_fused(q, k, v, gamma, gate, A, h0, opts.output_final_state, opts.scale, BT,
                                       store_states=opts.store_states)
        else:
            h, ht = chunk_fwd_states(k, v, gamma, gate, h0, opts.output_final_state, BT)
            o = chunk_fwd_output(q, k, v, h, gamma, gate, A, opts.scale, BT)
        ctx.save_for_backward(q, k, v, gamma, h, A)
        ctx.opts = opts
        ctx.gate = gate
        ctx.g_dtype = g.dtype if g is not None else None
        ctx.has_h0 = h0 is not None
        # an unused output then arrives as None in backward, not as a tensor of zeros
        ctx.set_materialize_grads(False)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        with launch_settings(**{chunk_op(ctx.gate): ctx.launch}):
            return ChunkGatedLinearAttentionFunction._backward(ctx, do, dht)

    @staticmethod
    def _backward(ctx, do, dht):
        q, k, v, gamma, h, A = ctx.saved_tensors
        opts, gate = ctx.opts, ctx.gate
        if h is None:
            raise RuntimeError("ChunkGatedLinearAttentionFunction: the forward kept no states (ChunkOptions."
                               "store_states=False) but a backward was asked for")
        BT = opts.chunk_size
        do = torch.zeros_like(v) if do is None else do.contiguous()
        dh, dh0 = chunk_bwd_states(q, do, gamma, gate, dht, ctx.has_h0, opts.scale, BT)
        if gate == GATE_VECTOR:
            dv = chunk_bwd_dv(q, k, do, dh, gamma, gate, A, opts.scale, BT)
            dq, dk, dg = gla_bwd_dqkg(q, k, v, do, h, dh, gamma, opts.scale, BT)
        else:  # dv from the dq/dk kernel where it fuses (DqkLaunch.fuse_dv), else its own kernel
            dq, dk, dg, dv = chunk_bwd_dqk(q, k, v, do, h, dh, gamma, gate, opts.scale, BT)
            if dv is None:
                dv = chunk_bwd_dv(q, k, do, dh, gamma, gate, A, opts.scale, BT)
        if dg is not None:
            dg = dg.to(ctx.g_dtype)
        return dq, dk, dv, dg, dh0, None
