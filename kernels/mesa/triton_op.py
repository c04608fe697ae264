"""Triton backend of mesa (arguments already validated by kernels.mesa.mesa).

MesaFunction (triton_function.py) runs inside the custom ops mesa_fwd / mesa_bwd
(kernels/common/custom_op.py) so that torch.compile traces the Triton path as opaque nodes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.common.custom_op import FunctionContext, fake_like, op_name, or_placeholder, placeholder, present
from kernels.common.launch import decode, encode
from kernels.common.triton.utils import check_chunk_size
from kernels.mesa.state import MesaState
from kernels.mesa.triton_function import MesaFunction, MesaOptions

MAX_K = 128  # the CG kernels hold a chunk's K x K state on-chip


@torch.library.custom_op(op_name("mesa_fwd"), mutates_args=())
def mesa_fwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, lamb: Tensor, h_kk0: Tensor | None,
    h_kv0: Tensor | None, scale: float, chunk_size: int, cg_steps: int, cg_tol: float | None,
    output_final_state: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """MesaFunction's forward as a custom op (inputs as MesaFunction takes them). Returns
    o [B, T, H, V] in v's dtype, the final states h_kk [B, H, K, K] and h_kv [B, H, K, V]
    fp32 (placeholders unless output_final_state) and what the backward reads besides the
    inputs: the states entering each chunk, [B, H, NT, K, K] and [B, H, NT, K, V], and
    q* [B, T, H, K], all fp32."""
    ctx = FunctionContext()
    opts = MesaOptions(scale=scale, chunk_size=chunk_size, cg_steps=cg_steps, cg_tol=cg_tol,
                       output_final_state=output_final_state)
    o, ht_kk, ht_kv = MesaFunction.forward(ctx, q, k, v, g, beta, lamb, h_kk0, h_kv0, opts)
    h_kk, h_kv, q_star = ctx.saved_tensors[5:]
    return o, or_placeholder(ht_kk, q.device), or_placeholder(ht_kv, q.device), h_kk, h_kv, q_star


@mesa_fwd.register_fake
def _mesa_fwd_fake(q, k, v, g, beta, lamb, h_kk0, h_kv0, scale, chunk_size, cg_steps, cg_tol, output_final_state):
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = (T + chunk_size - 1) // chunk_size
    f32 = torch.float32
    ht_kk = q.new_empty(B, H, K, K, dtype=f32) if output_final_state else placeholder(q.device)
    ht_kv = q.new_empty(B, H, K, V, dtype=f32) if output_final_state else placeholder(q.device)
    return (v.new_empty(B, T, H, V), ht_kk, ht_kv, q.new_empty(B, H, NT, K, K, dtype=f32),
            q.new_empty(B, H, NT, K, V, dtype=f32), q.new_empty(B, T, H, K, dtype=f32))


@torch.library.custom_op(op_name("mesa_bwd"), mutates_args=())
def mesa_bwd(
    do: Tensor | None, dht_kk: Tensor | None, dht_kv: Tensor | None, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
    lamb: Tensor, h_kk: Tensor, h_kv: Tensor, q_star: Tensor, scale: float, chunk_size: int, cg_steps: int,
    cg_tol: float | None, q_dtype: torch.dtype, has_h_kk0: bool, has_h_kv0: bool, launch: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """MesaFunction's backward as a custom op: (dq, dk, dv, dg, dbeta, dlamb, dh_kk0, dh_kv0),
    shaped as mesa_fwd's inputs (dq in q_dtype; the initial-state gradients fp32, or
    placeholders where the forward had none). launch: the forward's launch settings
    (kernels/common/launch.encode; the backward may run on another thread)."""
    opts = MesaOptions(scale=scale, chunk_size=chunk_size, cg_steps=cg_steps, cg_tol=cg_tol,
                       output_final_state=dht_kk is not None or dht_kv is not None)
    ctx = FunctionContext((k, v, g, beta, lamb, h_kk, h_kv, q_star), opts=opts, q_dtype=q_dtype,
                          has_h0=(has_h_kk0, has_h_kv0), launch=decode("mesa", launch))
    *grads, dh_kk0, dh_kv0, _ = MesaFunction.backward(ctx, do, dht_kk, dht_kv)
    return *grads, or_placeholder(dh_kk0, k.device), or_placeholder(dh_kv0, k.device)


@mesa_bwd.register_fake
def _mesa_bwd_fake(do, dht_kk, dht_kv, k, v, g, beta, lamb, h_kk, h_kv, q_star, scale, chunk_size, cg_steps,
                   cg_tol, q_dtype, has_h_kk0, has_h_kv0, launch):
    B, T, H, K = k.shape
    f32 = torch.float32
    dh_kk0 = k.new_empty(B, H, K, K, dtype=f32) if has_h_kk0 else placeholder(k.device)
    dh_kv0 = k.new_empty(B, H, K, v.shape[-1], dtype=f32) if has_h_kv0 else placeholder(k.device)
    return (k.new_empty(B, T, H, K, dtype=q_dtype), *(fake_like(t, k.device) for t in (k, v, g, beta)),
            lamb.new_empty(H, K, dtype=f32), dh_kk0, dh_kv0)


def _mesa_setup(ctx, inputs, output):
    q, k, v, g, beta, lamb, h_kk0, h_kv0, scale, chunk_size, cg_steps, cg_tol, output_final_state = inputs
    ctx.save_for_backward(k, v, g, beta, lamb, *output[3:])
    ctx.options = (scale, chunk_size, cg_steps, cg_tol)
    ctx.q_dtype, ctx.output_final_state = q.dtype, output_final_state
    ctx.has_h0 = (h_kk0 is not None, h_kv0 is not None)
    ctx.launch = encode("mesa")  # what the forward ran under, for the backward op
    ctx.set_materialize_grads(False)  # unused outputs arrive as None, not as zeros


def _mesa_backward(ctx, do, dht_kk, dht_kv, *residual_grads):
    if not ctx.output_final_state:
        dht_kk = dht_kv = None
    dq, dk, dv, dg, dbeta, dlamb, dh_kk0, dh_kv0 = mesa_bwd(
        do, dht_kk, dht_kv, *ctx.saved_tensors, *ctx.options, ctx.q_dtype, *ctx.has_h0, ctx.launch)
    return (dq, dk, dv, dg, dbeta, dlamb, present(dh_kk0, ctx.has_h0[0]), present(dh_kv0, ctx.has_h0[1]),
            None, None, None, None, None)


mesa_fwd.register_autograd(_mesa_backward, setup_context=_mesa_setup)


def mesa_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    lamb: torch.Tensor,
    *,
    scale: float,
    initial_state: MesaState | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    cg_steps: int = 30,
    cg_tol: float | None = None,
) -> tuple[torch.Tensor, MesaState | None]:
    """Chunkwise MesaNet on Triton, forward and backward.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g, beta: [B, T, H]; lamb: [H, K] > 0;
    initial_state: MesaState(h_kk [B, H, K, K], h_kv [B, H, K, V]) or None. K <= 128, any V
    and T. Per chunk, cg_steps conjugate-gradient iterations from the Jacobi start; with
    cg_tol a chunk's rows stop early once all their relative residuals are below it.
    fp16/bf16/fp32 inputs compute with fp32 states and iterates; fp64 inputs are computed
    in fp32. Returns o [B, T, H, V] in q's dtype and the final MesaState (fp32; fp64 for
    fp64 inputs) or None. Gradients flow to q, k, v, g, beta, lamb and the initial state.
    """
    check_chunk_size("mesa", chunk_size)
    K = q.shape[-1]
    if K > MAX_K:
        raise ValueError(f"mesa: backend='triton' supports K <= {MAX_K}, got K={K}; use backend='torch'")
    out_dtype = q.dtype
    compute = torch.float32 if out_dtype == torch.float64 else out_dtype
    q, k, v = (t.to(compute).contiguous() for t in (q, k, v))
    g, beta = g.contiguous(), beta.contiguous()
    h_kk0 = h_kv0 = None
    if initial_state is not None:
        h_kk0 = initial_state.h_kk.float().contiguous()
        h_kv0 = initial_state.h_kv.float().contiguous()
    o, ht_kk, ht_kv, *_ = mesa_fwd(
        q, k, v, g, beta, lamb.float().contiguous(), h_kk0, h_kv0, float(scale), int(chunk_size), int(cg_steps),
        None if cg_tol is None else float(cg_tol), bool(output_final_state),
    )
    final = None
    if output_final_state:
        state_dtype = torch.float64 if out_dtype == torch.float64 else torch.float32
        final = MesaState(ht_kk.to(state_dtype), ht_kv.to(state_dtype))
    return o.to(out_dtype), final
