"""Triton backend of linear_attention (arguments already validated by the public op).

Linear attention is gated linear attention without a gate, so it runs the same chunk
pipeline (kernels/gated_linear_attention/triton_function.py, through the custom ops of
kernels/gated_linear_attention/triton_op.py) with g = None.
"""

from __future__ import annotations

import torch

from kernels.gated_linear_attention.triton_op import gla_apply, prepare_inputs


def linear_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise linear attention on Triton, forward and backward: h_t = h_{t-1} + k_t v_t^T,
    o_t = h_t^T (scale q_t).

    q, k: [B, T, H, K]; v: [B, T, H, V]; initial_state: [B, H, K, V] or None. K, V up to 256,
    any T. Returns o: [B, T, H, V] in q's dtype and the final state [B, H, K, V] (fp32; fp64
    for fp64 inputs) or None. Gradients flow to q, k, v and initial_state.
    """
    (q, k, v), h0, out_dtype = prepare_inputs("linear_attention", (q, k, v), initial_state, chunk_size)
    o, ht = gla_apply(q, k, v, None, h0, scale, chunk_size, output_final_state)
    if out_dtype == torch.float64:
        o = o.to(out_dtype)
        ht = ht.to(out_dtype) if ht is not None else None
    return o, ht
