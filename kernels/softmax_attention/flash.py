"""Softmax attention through FlashAttention (CUDA, fp16/bf16): backends "fa4" (FlashAttention-4,
flash_attn.cute), "fa3" (FlashAttention-3, flash_attn_interface) and "flash_attn" (FlashAttention-2).

With a KV cache of S tokens, the T new queries attend to every cached key and to the new keys
up to themselves: the causal mask of the [T, S + T] score matrix aligned to its bottom-right
corner. Each version's causal mask when seqlen_q < seqlen_k:
  - FA4: bottom-right (its mask keeps k_index <= q_index + seqlen_k - seqlen_q);
  - FA3: bottom-right (flash_attn_interface.flash_attn_func's documented convention);
  - FA2: bottom-right from 2.1 on, top-left before; a cached call on FA2 older than 2.1 is
    refused, since its answer would be wrong.
So the cached case is one call on the cache's keys and values followed by the new ones, as the
uncached case is. Each package is imported when its backend first runs (all are optional).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from kernels.common import dispatch
from kernels.softmax_attention.cache import KVCache, append_to_cache

OP = "softmax_attention"
HALF_DTYPES = (torch.float16, torch.bfloat16)


def dtype_error(backend: str, dtype: torch.dtype | None) -> str | None:
    """Why a FlashAttention `backend` cannot take inputs of `dtype`, or None when it can (or
    `backend` is no FlashAttention, or the dtype is not known yet)."""
    if backend not in dispatch.FLASH_BACKENDS or dtype is None or dtype in HALF_DTYPES:
        return None
    return (f"backend={backend!r} takes float16 or bfloat16 inputs, got {str(dtype).removeprefix('torch.')}; "
            "use backend='torch' (SDPA), which 'auto' picks for this dtype")


def head_dim_error(backend: str, K: int, V: int, capability: tuple[int, int] | None) -> str | None:
    """Why `backend` cannot take head dims K (q, k) and V (v) on a GPU of `capability`, or None.

    FA2 and FA3 take K == V up to 256 (FA3: a multiple of 8); FA4 takes multiples of 8 from 8
    to 256 on Hopper, and on sm100/sm110 from 8 to 128, K = 192 with V = 128, or K = V = 256."""
    if backend == "fa4":
        if K % 8 or V % 8:
            return f"backend='fa4' takes head dims that are multiples of 8, got K={K}, V={V}"
        major = capability[0] if capability else 9
        if major == 9 and not (8 <= K <= 256 and 8 <= V <= 256):
            return f"backend='fa4' takes head dims from 8 to 256 on sm90, got K={K}, V={V}"
        if major in (10, 11) and not (max(K, V) <= 128 or (K, V) in ((192, 128), (256, 256))):
            return (f"backend='fa4' takes head dims up to 128, (192, 128) or (256, 256) on sm{major}x, "
                    f"got K={K}, V={V}")
        return None
    if K != V:
        return f"backend={backend!r} needs equal head dims for q, k and v, got K={K}, V={V}"
    if K > 256:
        return f"backend={backend!r} takes head dims up to 256, got {K}"
    if backend == "fa3" and K % 8:
        return f"backend='fa3' takes head dims that are multiples of 8, got {K}"
    return None


def _major_minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as "2.8.3.post1", or None when it has none."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def _attend(
    backend: str, flash_attn_func: Callable[..., object], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    scale: float, initial_state: KVCache | None, output_final_state: bool,
) -> tuple[torch.Tensor, KVCache | None]:
    """Check what the kernel of `backend` takes, then run it once over cache and new tokens."""
    reason = dtype_error(backend, q.dtype)
    if reason:
        raise ValueError(f"{OP}: {reason}")
    reason = head_dim_error(backend, q.shape[-1], v.shape[-1], dispatch.device_capability(q.device))
    if reason:
        raise ValueError(f"{OP}: {reason}; use backend='torch' (SDPA), which takes any head dims")
    cache = append_to_cache(k, v, initial_state)
    o = flash_attn_func(q, cache.k, cache.v, softmax_scale=scale, causal=True)
    # FA4 and FA3 builds before its return_attn_probs flag return (out, logsumexp).
    if isinstance(o, tuple):
        o = o[0]
    return o, (cache if output_final_state else None)


def softmax_attention_fa4(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
    initial_state: KVCache | None = None, output_final_state: bool = False,
) -> tuple[torch.Tensor, KVCache | None]:
    """Causal softmax attention by FlashAttention-4 (flash_attn.cute.flash_attn_func).

    q, k: [B, T, H, K]; v: [B, T, H, V]; fp16/bf16 on an sm90+ GPU; initial_state: KVCache of
    S earlier tokens or None. Returns (o [B, T, H, V] in q's dtype, KVCache of all S + T tokens
    if output_final_state else None)."""
    import flash_attn.cute as fa4  # lazy: optional, and its CuTe DSL is slow to import

    return _attend("fa4", fa4.flash_attn_func, q, k, v, scale, initial_state, output_final_state)


def softmax_attention_fa3(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
    initial_state: KVCache | None = None, output_final_state: bool = False,
) -> tuple[torch.Tensor, KVCache | None]:
    """Causal softmax attention by FlashAttention-3 (flash_attn_interface.flash_attn_func).

    q, k: [B, T, H, K]; v: [B, T, H, V] with V == K; fp16/bf16 on an sm90+ GPU; initial_state:
    KVCache of S earlier tokens or None. Returns (o [B, T, H, V] in q's dtype, KVCache of all
    S + T tokens if output_final_state else None)."""
    import flash_attn_interface as fa3  # lazy: an optional CUDA-only package

    return _attend("fa3", fa3.flash_attn_func, q, k, v, scale, initial_state, output_final_state)


def softmax_attention_flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
    initial_state: KVCache | None = None, output_final_state: bool = False,
) -> tuple[torch.Tensor, KVCache | None]:
    """Causal softmax attention by FlashAttention-2 (flash_attn.flash_attn_func).

    q, k: [B, T, H, K]; v: [B, T, H, V] with V == K; fp16/bf16 on CUDA; initial_state: KVCache
    of S earlier tokens or None (needs flash-attn >= 2.1, whose causal mask is aligned
    bottom-right). Returns (o [B, T, H, V] in q's dtype, KVCache of all S + T tokens if
    output_final_state else None)."""
    import flash_attn as fa2  # lazy: an optional CUDA-only package

    if initial_state is not None and initial_state.k.shape[1] > 0:
        version = getattr(fa2, "__version__", "")
        if (_major_minor(version) or (0, 0)) < (2, 1):
            raise ValueError(
                f"{OP}: backend='flash_attn' with a KV cache needs flash-attn >= 2.1 (its causal mask is "
                f"aligned bottom-right from 2.1 on), got {version or 'an unknown version'}; upgrade it, or "
                "use backend='torch' (SDPA) for cached calls")
    return _attend("flash_attn", fa2.flash_attn_func, q, k, v, scale, initial_state, output_final_state)
