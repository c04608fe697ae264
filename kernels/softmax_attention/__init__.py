"""Causal softmax attention, o_t = sum_{i<=t} softmax_i(scale q_t . k_i) v_i (docs/design.md §3),
with a KV cache as its state.

Backends: reference (explicit masked softmax, fp32/fp64), torch (scaled_dot_product_attention),
fa4 / fa3 / flash_attn (FlashAttention-4, -3, -2; CUDA, fp16/bf16; flash.py). "auto" runs the
first of those three that runs here for fp16/bf16 on CUDA, else torch (spec.py). There is no
triton backend.
"""

from __future__ import annotations

import torch

from kernels.common.checks import check_step_qkv, default_scale
from kernels.common.spec import dispatch
from kernels.softmax_attention.cache import KVCache, check_kv_cache
from kernels.softmax_attention.spec import SPEC
from kernels.softmax_attention.step import softmax_attention_step_unchecked

OP = "softmax_attention"


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    initial_state: KVCache | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
    check_values: bool = True,
) -> tuple[torch.Tensor, KVCache | None]:
    """Causal softmax attention.

    q, k: [B, T, H, K]; v: [B, T, H, V]; scale multiplies q (default K ** -0.5);
    initial_state: KVCache(k [B, S, H, K], v [B, S, H, V]) of S earlier tokens, which every
    new query attends to in full, or None. backend: "auto" | "reference" | "torch" | "fa4" |
    "fa3" | "flash_attn" ("auto": the fastest FlashAttention usable here for fp16/bf16 on
    CUDA, else torch; the FlashAttention backends refuse fp32/fp64 and the CPU). Returns o:
    [B, T, H, V] in q's dtype and, if output_final_state, the KVCache of all S + T tokens (in
    the dtype of k, v), else None.

    check_values: accepted so that every op takes it; this op has no values to check (its
    shape, dtype and device checks read no data).
    """
    return dispatch(
        SPEC, backend, check_values, q=q, k=k, v=v, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state,
    )


def softmax_attention_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    state: KVCache | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, KVCache]:
    """One decoding token. q_t, k_t: [B, H, K]; v_t: [B, H, V]; state: KVCache of S tokens
    or None. Returns (o_t [B, H, V] in q_t's dtype, KVCache of S + 1 tokens)."""
    op = OP + "_step"
    B, H, K, V = check_step_qkv(op, q_t, k_t, v_t)
    check_kv_cache(op, "state", state, B, H, K, V)
    scale = default_scale(op, scale, K)
    return softmax_attention_step_unchecked(q_t, k_t, v_t, state, scale)


__all__ = ["KVCache", "softmax_attention", "softmax_attention_step"]
