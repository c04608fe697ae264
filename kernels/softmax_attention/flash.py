"""Softmax attention through flash_attn.flash_attn_func (backend "flash_attn", CUDA only)."""

from __future__ import annotations

import torch

from kernels.softmax_attention.cache import KVCache, append_to_cache


def softmax_attention_flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    initial_state: KVCache | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, KVCache | None]:
    """Causal softmax attention by FlashAttention; q, k, v as the public op, fp16/bf16 only.

    flash_attn aligns its causal mask bottom-right (since 2.1), which is exactly the
    attention of T new queries over S cached plus T new keys."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(
            f"softmax_attention: backend='flash_attn' needs float16 or bfloat16 q, k, v, got {q.dtype}"
        )
    from flash_attn import flash_attn_func  # lazy: an optional CUDA-only package

    cache = append_to_cache(k, v, initial_state)
    o = flash_attn_func(q, cache.k, cache.v, softmax_scale=scale, causal=True)
    return o, (cache if output_final_state else None)
