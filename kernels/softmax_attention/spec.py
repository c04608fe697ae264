"""The OpSpec of causal softmax attention (kernels.common.spec); its state is a KV cache.

"auto" runs, for fp16/bf16 inputs on CUDA, the first FlashAttention that runs here, fastest
first: fa4 (FlashAttention-4), fa3 (FlashAttention-3), flash_attn (FlashAttention-2); else, and
for fp32/fp64, torch (SDPA, which picks its own cuDNN / flash / efficient kernel).
"""

from __future__ import annotations

from typing import Any

import torch

from kernels.common import counts, inputs
from kernels.common.checks import check_qkv, default_scale
from kernels.common.dispatch import FLASH_BACKENDS, BackendStatus, backend_status
from kernels.common.spec import Backend, Counts, OpSpec
from kernels.softmax_attention.cache import KVCache, check_kv_cache
from kernels.softmax_attention.flash import HALF_DTYPES, dtype_error
from kernels.softmax_attention.reference import softmax_attention_reference
from kernels.softmax_attention.sdpa import softmax_attention_sdpa

CACHED_TOKENS = 8  # tokens in the KV cache the input factory makes


def validate(op: str, args: dict[str, Any], check_values: bool) -> dict[str, Any]:
    """q, k, v, initial_state (a KVCache) and scale; no values to check."""
    B, T, H, K, V = check_qkv(op, args["q"], args["k"], args["v"])
    check_kv_cache(op, "initial_state", args["initial_state"], B, H, K, V)
    args["scale"] = default_scale(op, args["scale"], K)
    return args


def forward_flops(B: int, T: int, H: int, K: int, V: int, **_: Any) -> float:
    return counts.softmax_forward(B, T, H, K, V)


def decode_flops(B: int, H: int, K: int, V: int, context: int) -> float:
    # q . k over S+1 keys (2(S+1)K) and the weighted sum of S+1 values (2(S+1)V).
    return float(B * H * 2 * (context + 1) * (K + V))


def cache(draw: inputs.Draw, B: int, H: int, K: int, V: int) -> KVCache:
    earlier = inputs.qkv(draw, B, CACHED_TOKENS, H, K, V)
    return KVCache(earlier["k"], earlier["v"])


def auto_choice(device: torch.device | str, dtype: torch.dtype | None) -> tuple[str, list[BackendStatus]]:
    """The backend "auto" picks for inputs of `dtype` on `device`, and the status of every
    FlashAttention backend it passed over (each one's reason says why it does not run here)."""
    if dtype not in HALF_DTYPES:
        why = f"takes float16 or bfloat16 inputs, got {str(dtype).removeprefix('torch.')}"
        return "torch", [BackendStatus(b, False, why) for b in FLASH_BACKENDS]
    passed = []
    for name in FLASH_BACKENDS:
        status = backend_status(name, device)
        if status.usable:
            return name, passed
        passed.append(status)
    return "torch", passed


def auto_softmax(device: torch.device | str, dtype: torch.dtype | None = None) -> str:
    """"auto" for softmax attention: the first usable of fa4, fa3, flash_attn for fp16/bf16, else torch."""
    return auto_choice(device, dtype)[0]


def explain_auto(device: torch.device | str, dtype: torch.dtype | None) -> str:
    """One line: what "auto" runs for `dtype` inputs on `device`, and why each faster
    FlashAttention does not run there."""
    chosen, passed = auto_choice(device, dtype)
    dtype_name = str(dtype).removeprefix("torch.")
    line = f"auto runs {chosen}{' (SDPA)' if chosen == 'torch' else ''} for {dtype_name} on {torch.device(device)}"
    reasons: dict[str, list[str]] = {}
    for status in passed:
        reasons.setdefault(status.reason, []).append(status.name)
    if reasons:
        line += "; passed over " + "; ".join(f"{', '.join(names)}: {why}" for why, names in reasons.items())
    return line


class SoftmaxSpec(OpSpec):
    """The OpSpec whose resolution also refuses a FlashAttention backend for fp32/fp64 inputs,
    so that a mixer or a task learns it when it resolves, before any call."""

    def resolve(self, requested: str, device: torch.device | str, dtype: torch.dtype | None = None) -> str:
        chosen = super().resolve(requested, device, dtype)
        reason = dtype_error(chosen, dtype)
        if reason:
            raise ValueError(f"{self.name}: {reason}")
        return chosen


SPEC = SoftmaxSpec(
    name="softmax_attention",
    function="kernels.softmax_attention:softmax_attention",
    step="kernels.softmax_attention:softmax_attention_step",
    state="KVCache(k [B, S, H, K], v [B, S, H, V]) of the S tokens seen (in the dtype of k, v)",
    backends={
        "reference": Backend(softmax_attention_reference),
        "torch": Backend(softmax_attention_sdpa),
        "fa4": Backend("kernels.softmax_attention.flash:softmax_attention_fa4"),
        "fa3": Backend("kernels.softmax_attention.flash:softmax_attention_fa3"),
        "flash_attn": Backend("kernels.softmax_attention.flash:softmax_attention_flash"),
    },
    auto=auto_softmax,
    validate=validate,
    counts=Counts(forward_flops, counts.FWDBWD_SOFTMAX, decode_flops),
    inputs=inputs.factory(initial_state=cache),
)
