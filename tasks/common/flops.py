"""FLOP counts of every op and layer, written down in one place.

Conventions (so TFLOP/s figures are comparable across mixers and with other benchmarks):
- A matrix product of [m, k] by [k, n] costs 2 m n k FLOPs (one multiply and one add per
  term). Elementwise work (exp, masks, gates, norms, activations) is not counted: it is
  memory-bound, and the published kernel benchmarks do not count it either.
- Softmax attention, causal: the T x T score matrix is half computed, so the forward costs
  2 T^2 (K + V) / 2 per head (QK^T and PV); this is FlashAttention's count. Its backward
  recomputes QK^T and has dV, dP, dQ, dK: 5 products against the forward's 2, so 2.5 x the
  forward, and forward+backward is 3.5 x the forward.
- The linear ops are counted in their chunkwise form (docs/design.md §10) with the mixer's chunk
  size C, since that is the algorithm our torch and triton backends (and FLA's) execute;
  the dense intra-chunk products are counted in full (C x C, not the causal half), as a
  kernel computes them. Their backward is counted as 2 x the forward (every product Y = AB
  needs dA and dB), so forward+backward is 3 x the forward.
- Decode steps (one token against a cache or state) count every multiply-add on the state.
- Layer level adds the mixer's nn.Linear layers (2 tokens in out each, backward 2 x) and the
  short convolutions (2 tokens channels width each) to the op.
Counts are for the whole batch: B sequences, H heads. Each op's count is in its OpSpec
(kernels/<op>/spec.py, shared pieces in kernels/common/counts.py); this module reads them.
"""

from __future__ import annotations

from torch import nn

from kernels.common.counts import chunk_sizes
from kernels.common.counts import softmax_forward as softmax_forward_flops
from kernels.common.spec import Counts
from kernels.registry import SPECS

FWDBWD_FACTOR_DENSE = 3.0

__all__ = ["chunk_sizes", "chunked_forward_flops", "decode_flops", "dense_flops", "mixer_flops", "mixer_op_args",
           "op_flops", "softmax_forward_flops"]


def _counts(caller: str, op: str) -> Counts:
    """The FLOP counts in op's OpSpec (kernels.registry)."""
    if op not in SPECS:
        raise ValueError(f"{caller}: op={op!r} has no count; known ops: {sorted(SPECS)}")
    return SPECS[op].counts


def chunked_forward_flops(op: str, B: int, T: int, H: int, K: int, V: int, chunk_size: int = 64, cg_steps: int = 0) -> float:
    """Forward FLOPs of an op (the linear ops in their chunkwise form; see the module docstring)."""
    return _counts("chunked_forward_flops", op).forward(B, T, H, K, V, chunk_size=chunk_size, cg_steps=cg_steps)


def op_flops(op: str, phase: str, B: int, T: int, H: int, K: int, V: int, chunk_size: int = 64, cg_steps: int = 0) -> float:
    """FLOPs of one call of `op` for phase "fwd" or "fwdbwd" on [B, T, H, K/V] inputs."""
    if phase not in ("fwd", "fwdbwd"):
        raise ValueError(f"op_flops: phase must be 'fwd' or 'fwdbwd', got {phase!r}")
    return _counts("op_flops", op).flops(phase, B, T, H, K, V, chunk_size=chunk_size, cg_steps=cg_steps)


def decode_flops(op: str, B: int, H: int, K: int, V: int, context: int) -> float:
    """FLOPs of one decode step after `context` tokens, for B sequences."""
    return _counts("decode_flops", op).decode(B, H, K, V, context)


def dense_flops(module: nn.Module, tokens: int) -> float:
    """Forward FLOPs of the module's nn.Linear layers and depthwise nn.Conv1d layers on `tokens` tokens."""
    total = 0
    for m in module.modules():
        if isinstance(m, nn.Linear):
            total += 2 * tokens * m.in_features * m.out_features
        elif isinstance(m, nn.Conv1d):
            total += 2 * tokens * m.out_channels * (m.in_channels // m.groups) * m.kernel_size[0]
    return float(total)


def mixer_op_args(mixer: nn.Module) -> dict:
    """The op name and the sizes its FLOP count needs, read off a ProjectedMixer.

    The linear mixer with normalize=True runs its op with one extra value column (the
    denominator); lin_gdn with form='vala' is counted as linear attention (its first-order form)."""
    config = mixer.config
    op = mixer.op_name
    value_dim = mixer.value_dim + int(op == "linear_attention" and getattr(config, "normalize", False))
    if op == "linearized_softmax_gdn" and getattr(config, "form", "gdn") == "vala":
        op = "linear_attention"
    return {
        "op": op, "H": mixer.num_heads, "K": mixer.head_dim, "V": value_dim,
        "chunk_size": getattr(config, "chunk_size", 64), "cg_steps": getattr(config, "cg_steps", 0) or 0,
    }


def mixer_flops(mixer: nn.Module, mode: str, phase: str, B: int, T: int) -> float:
    """FLOPs of one op-level or layer-level call of a mixer: phase fwd, fwdbwd or decode (T = context)."""
    a = mixer_op_args(mixer)
    if phase == "decode":
        total = decode_flops(a["op"], B, a["H"], a["K"], a["V"], T)
        dense_tokens, factor = B, 1.0
    else:
        total = op_flops(a["op"], phase, B, T, a["H"], a["K"], a["V"], a["chunk_size"], a["cg_steps"])
        dense_tokens, factor = B * T, (FWDBWD_FACTOR_DENSE if phase == "fwdbwd" else 1.0)
    if mode == "layer":
        total += factor * dense_flops(mixer, dense_tokens)
    elif mode != "op":
        raise ValueError(f"mixer_flops: mode must be 'op' or 'layer', got {mode!r}")
    return total
