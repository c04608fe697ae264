"""Triton backend of gated_linear_attention (arguments already validated by the public op).

ChunkGatedLinearAttentionFunction (triton_function.py) runs inside the custom ops gla_fwd /
gla_bwd (kernels/common/custom_op.py) so that torch.compile traces the Triton path as
opaque nodes; `gla_apply` is the differentiable entry, shared with linear attention.
The forward op runs under the launch settings in effect (kernels/common/launch/) and
hands them to the backward op as a JSON string (`launch`), which may run on another thread.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.common.custom_op import FunctionContext, fake_like, op_name, or_placeholder, placeholder, present
from kernels.common.launch import decode, encode
from kernels.common.triton.gates import GATE_VECTOR
from kernels.common.triton.utils import check_chunk_size, chunk_op
from kernels.gated_linear_attention.triton_function import (
    ChunkGatedLinearAttentionFunction,
    ChunkOptions,
    gate_mode,
    grad_wanted,
)


@torch.library.custom_op(op_name("gla_fwd"), mutates_args=())
def gla_fwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, h0: Tensor | None, scale: float, chunk_size: int,
    output_final_state: bool, store_states: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """ChunkGatedLinearAttentionFunction's forward as a custom op. q, k: [B, T, H, K], v:
    [B, T, H, V] (one dtype, contiguous); g: [B, T, H], [B, T, H, K] or None; h0:
    [B, H, K, V] fp32 or None. Returns o [B, T, H, V] in v's dtype, the final state
    [B, H, K, V] fp32 (a placeholder unless output_final_state) and what the backward reads
    besides the inputs: gamma (fp32, g's shape; a placeholder without g), the states entering
    each chunk [B, H, NT, K, V] in k's dtype (a placeholder unless store_states) and A
    [B, T, H, chunk_size] fp32 (a placeholder unless g is a vector gate)."""
    ctx = FunctionContext()
    opts = ChunkOptions(scale=scale, chunk_size=chunk_size, output_final_state=output_final_state,
                        store_states=store_states)
    o, ht = ChunkGatedLinearAttentionFunction.forward(ctx, q, k, v, g, h0, opts)
    gamma, h, A = ctx.saved_tensors[3:]
    return o, *(or_placeholder(t, q.device) for t in (ht, gamma, h, A))


@gla_fwd.register_fake
def _gla_fwd_fake(q, k, v, g, h0, scale, chunk_size, output_final_state, store_states):
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = (T + chunk_size - 1) // chunk_size
    f32 = torch.float32
    ht = q.new_empty(B, H, K, V, dtype=f32) if output_final_state else placeholder(q.device)
    gamma = q.new_empty(g.shape, dtype=f32) if g is not None else placeholder(q.device)
    h = k.new_empty(B, H, NT, K, V) if store_states else placeholder(q.device)
    A = q.new_empty(B, T, H, chunk_size, dtype=f32) if gate_mode(g) == GATE_VECTOR else placeholder(q.device)
    return v.new_empty(B, T, H, V), ht, gamma, h, A


@torch.library.custom_op(op_name("gla_bwd"), mutates_args=())
def gla_bwd(
    do: Tensor | None, dht: Tensor | None, q: Tensor, k: Tensor, v: Tensor, gamma: Tensor | None, h: Tensor | None,
    A: Tensor | None, scale: float, chunk_size: int, gate: int, g_dtype: torch.dtype | None, has_h0: bool,
    launch: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """ChunkGatedLinearAttentionFunction's backward as a custom op: (dq, dk, dv, dg, dh0),
    shaped as gla_fwd's q, k, v, g (in g_dtype) and h0 (fp32); dg is a placeholder without
    a gate and dh0 without h0. gate: the forward's gate mode (triton_function.gate_mode);
    launch: the forward's launch settings (kernels/common/launch.encode)."""
    opts = ChunkOptions(scale=scale, chunk_size=chunk_size, output_final_state=dht is not None)
    ctx = FunctionContext((q, k, v, gamma, h, A), opts=opts, gate=gate, g_dtype=g_dtype, has_h0=has_h0,
                          launch=decode(chunk_op(gate), launch))
    dq, dk, dv, dg, dh0, _ = ChunkGatedLinearAttentionFunction.backward(ctx, do, dht)
    return dq, dk, dv, or_placeholder(dg, q.device), or_placeholder(dh0, q.device)


@gla_bwd.register_fake
def _gla_bwd_fake(do, dht, q, k, v, gamma, h, A, scale, chunk_size, gate, g_dtype, has_h0, launch):
    B, T, H, K = q.shape
    dg = q.new_empty(gamma.shape, dtype=g_dtype) if gamma is not None else placeholder(q.device)
    dh0 = q.new_empty(B, H, K, v.shape[-1], dtype=torch.float32) if has_h0 else placeholder(q.device)
    return fake_like(q, q.device), fake_like(k, q.device), fake_like(v, q.device), dg, dh0


def _gla_setup(ctx, inputs, output):
    q, k, v, g, h0, scale, chunk_size, output_final_state, store_states = inputs
    _, _, gamma, h, A = output
    ctx.save_for_backward(q, k, v, gamma, h, A)
    ctx.scale, ctx.chunk_size, ctx.output_final_state, ctx.store_states = scale, chunk_size, output_final_state, store_states
    ctx.gate, ctx.g_dtype, ctx.has_h0 = gate_mode(g), (g.dtype if g is not None else None), h0 is not None
    ctx.launch = encode(chunk_op(ctx.gate))  # what the forward ran under, for the backward op
    # an unused output then arrives as None in backward, not as a tensor of zeros
    ctx.set_materialize_grads(False)


def _gla_backward(ctx, do, dht, *residual_grads):
    q, k, v, gamma, h, A = ctx.saved_tensors
    has_g = ctx.g_dtype is not None
    dq, dk, dv, dg, dh0 = gla_bwd(
        do, dht if ctx.output_final_state else None, q, k, v, present(gamma, has_g), present(h, ctx.store_states),
        present(A, ctx.gate == GATE_VECTOR), ctx.scale, ctx.chunk_size, ctx.gate, ctx.g_dtype, ctx.has_h0, ctx.launch,
    )
    return dq, dk, dv, present(dg, has_g), present(dh0, ctx.has_h0), None, None, None, None


gla_fwd.register_autograd(_gla_backward, setup_context=_gla_setup)


def gla_apply(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, h0: Tensor | None, scale: float, chunk_size: int,
    output_final_state: bool,
) -> tuple[Tensor, Tensor | None]:
    """The differentiable Triton chunk pipeline on prepared inputs (as gla_fwd takes them;
    g None: linear attention). Returns (o [B, T, H, V], final state [B, H, K, V] fp32 or
    None); per-chunk states are kept only when autograd will want a backward."""
    store_states = grad_wanted(q, k, v, g, h0)
    o, ht, *_ = gla_fwd(q, k, v, g, h0, float(scale), int(chunk_size), bool(output_final_state), store_states)
    return o, present(ht, output_final_state)


def prepare_inputs(
    op: str, tensors: tuple[torch.Tensor, ...], initial_state: torch.Tensor | None, chunk_size: int
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None, torch.dtype]:
    """Make the kernels' inputs: q, k, v (`tensors`) contiguous in one compute dtype (q's;
    fp64 is computed in fp32), fp32 initial state. Returns (tensors, h0, the dtype o must
    be returned in). Gates keep their own dtype: the kernels read them in fp32."""
    check_chunk_size(op, chunk_size)
    out_dtype = tensors[0].dtype
    compute = torch.float32 if out_dtype == torch.float64 else out_dtype
    prepared = tuple(t.to(compute).contiguous() for t in tensors)
    h0 = initial_state.float().contiguous() if initial_state is not None else None
    return prepared, h0, out_dtype


def gated_linear_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise GLA on Triton, forward and backward.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] (scalar gate) or [B, T, H, K] (vector
    gate), log-space, <= 0; initial_state: [B, H, K, V] or None. K, V up to 256, any T.
    Returns o: [B, T, H, V] in q's dtype and the final state [B, H, K, V] (fp32; fp64 for
    fp64 inputs) or None. fp16/bf16/fp32 compute in their dtype with fp32 accumulation;
    fp64 inputs are computed in fp32. Gradients flow to q, k, v, g and initial_state.
    """
    (q, k, v), h0, out_dtype = prepare_inputs("gated_linear_attention", (q, k, v), initial_state, chunk_size)
    o, ht = gla_apply(q, k, v, g.contiguous(), h0, scale, chunk_size, output_final_state)
    if out_dtype == torch.float64:
        o = o.to(out_dtype)
        ht = ht.to(out_dtype) if ht is not None else None
    return o, ht
