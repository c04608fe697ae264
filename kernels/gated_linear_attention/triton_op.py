"""Triton backend of gated_linear_attention (arguments already validated by the public op)."""

from __future__ import annotations

import torch

from kernels.common.triton.utils import check_chunk_size
from kernels.gated_linear_attention.triton_function import (
    ChunkGatedLinearAttentionFunction,
    ChunkOptions,
    grad_wanted,
)


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
    g = g.contiguous()
    opts = ChunkOptions(scale=float(scale), chunk_size=chunk_size, output_final_state=output_final_state,
                        store_states=grad_wanted(q, k, v, g, h0))
    o, ht = ChunkGatedLinearAttentionFunction.apply(q, k, v, g, h0, opts)
    if out_dtype == torch.float64:
        o = o.to(out_dtype)
        ht = ht.to(out_dtype) if ht is not None else None
    return o, ht
