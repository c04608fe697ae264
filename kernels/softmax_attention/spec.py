"""The OpSpec of causal softmax attention (kernels.common.spec); its state is a KV cache."""

from __future__ import annotations

from typing import Any

from kernels.common import counts, inputs
from kernels.common.checks import check_qkv, default_scale
from kernels.common.dispatch import auto_attention
from kernels.common.spec import Backend, Counts, OpSpec
from kernels.softmax_attention.cache import KVCache, check_kv_cache
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


SPEC = OpSpec(
    name="softmax_attention",
    function="kernels.softmax_attention:softmax_attention",
    step="kernels.softmax_attention:softmax_attention_step",
    state="KVCache(k [B, S, H, K], v [B, S, H, V]) of the S tokens seen (in the dtype of k, v)",
    backends={
        "reference": Backend(softmax_attention_reference),
        "torch": Backend(softmax_attention_sdpa),
        "flash_attn": Backend("kernels.softmax_attention.flash:softmax_attention_flash"),
    },
    auto=auto_attention,
    validate=validate,
    counts=Counts(forward_flops, counts.FWDBWD_SOFTMAX, decode_flops),
    inputs=inputs.factory(initial_state=cache),
)
