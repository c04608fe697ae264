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
Counts are for the whole batch: B sequences, H heads.
"""

from __future__ import annotations

from torch import nn

FWDBWD_FACTOR_SOFTMAX = 3.5
FWDBWD_FACTOR_CHUNKED = 3.0
FWDBWD_FACTOR_DENSE = 3.0


def chunk_sizes(T: int, C: int) -> list[tuple[int, int]]:
    """[(number of chunks, chunk length)]: T // C full chunks and one remainder chunk."""
    if T < 1 or C < 1:
        raise ValueError(f"chunk_sizes: need T >= 1 and C >= 1, got T={T}, C={C}")
    out = [(T // C, C)] if T >= C else []
    if T % C:
        out.append((1, T % C))
    return out


def softmax_forward_flops(B: int, T: int, H: int, K: int, V: int, cache_len: int = 0) -> float:
    """Causal softmax attention of T new queries after `cache_len` cached keys.

    Per head: the T x cache block is full (2 T S (K+V)), the T x T block half (T^2 (K+V))."""
    return float(B * H * (K + V) * (T * T + 2 * T * cache_len))


def _chunk_linear(c: int, K: int, V: int) -> float:
    # Q S (2cKV) + Q K^T (2c^2 K) + scores V (2c^2 V) + state update K^T V (2cKV).
    return 4 * c * K * V + 2 * c * c * (K + V)


def _chunk_delta(c: int, K: int, V: int) -> float:
    # A = K K^T (2c^2 K); Tm = (I + A)^-1 by forward substitution (c^3 / 3);
    # W = Tm (beta K) (2c^2 K); U0 = Tm (beta V) (2c^2 V); U = U0 - W S (2cKV);
    # O = Q S (2cKV) + (Q K^T) (2c^2 K) U (2c^2 V); S' = S + K^T U (2cKV).
    return c**3 / 3 + 6 * c * c * K + 4 * c * c * V + 6 * c * K * V


def _chunk_mesa(c: int, K: int, V: int, cg_steps: int) -> float:
    # H_kv path as gated linear attention with q* as the query (_chunk_linear), the H_kk
    # state update K^T K (2cK^2), and per CG iteration one mat-vec for all c tokens:
    # P H0 (2cK^2) + (P K^T) (2c^2 K) times K (2c^2 K).
    return _chunk_linear(c, K, V) + 2 * c * K * K + cg_steps * (2 * c * K * K + 4 * c * c * K)


def chunked_forward_flops(op: str, B: int, T: int, H: int, K: int, V: int, chunk_size: int = 64, cg_steps: int = 0) -> float:
    """Forward FLOPs of a linear op's chunkwise form (see the module docstring)."""
    per_chunk = {
        "linear_attention": lambda c: _chunk_linear(c, K, V),
        "gated_linear_attention": lambda c: _chunk_linear(c, K, V),
        "delta_rule": lambda c: _chunk_delta(c, K, V),
        # Runs on the gated delta rule after O(T (K + V)) elementwise preprocessing.
        "gated_delta_rule": lambda c: _chunk_delta(c, K, V),
        "linearized_softmax_gdn": lambda c: _chunk_delta(c, K, V),
        "mesa": lambda c: _chunk_mesa(c, K, V, cg_steps),
    }
    if op not in per_chunk:
        raise ValueError(f"chunked_forward_flops: op={op!r} has no count; known ops: {sorted(per_chunk)}")
    return float(B * H * sum(n * per_chunk[op](c) for n, c in chunk_sizes(T, chunk_size)))


def op_flops(op: str, phase: str, B: int, T: int, H: int, K: int, V: int, chunk_size: int = 64, cg_steps: int = 0) -> float:
    """FLOPs of one call of `op` for phase "fwd" or "fwdbwd" on [B, T, H, K/V] inputs."""
    if phase not in ("fwd", "fwdbwd"):
        raise ValueError(f"op_flops: phase must be 'fwd' or 'fwdbwd', got {phase!r}")
    if op == "softmax_attention":
        fwd, factor = softmax_forward_flops(B, T, H, K, V), FWDBWD_FACTOR_SOFTMAX
    else:
        fwd, factor = chunked_forward_flops(op, B, T, H, K, V, chunk_size, cg_steps), FWDBWD_FACTOR_CHUNKED
    return fwd * (factor if phase == "fwdbwd" else 1.0)


def decode_flops(op: str, B: int, H: int, K: int, V: int, context: int) -> float:
    """FLOPs of one decode step after `context` tokens, for B sequences."""
    per_head = {
        # q . k over S+1 keys (2(S+1)K) and the weighted sum of S+1 values (2(S+1)V).
        "softmax_attention": 2 * (context + 1) * (K + V),
        # h += k v^T (2KV); o = h^T q (2KV).
        "linear_attention": 4 * K * V,
        # decay h (KV) + the linear-attention step.
        "gated_linear_attention": 5 * K * V,
        # k^T h (2KV), h -= beta k (k^T h - v)^T (2KV), o = h^T q (2KV).
        "delta_rule": 6 * K * V,
        # decay h (KV) + the delta-rule step.
        "gated_delta_rule": 7 * K * V,
        "linearized_softmax_gdn": 7 * K * V,
        # H_kk, H_kv: decay and rank-1 update (3K^2 + 3KV); exact solve by LU (2K^3/3) and
        # two triangular solves (2K^2); o = H_kv^T q* (2KV).
        "mesa": 5 * K * K + 5 * K * V + 2 * K**3 / 3,
    }
    if op not in per_head:
        raise ValueError(f"decode_flops: op={op!r} has no count; known ops: {sorted(per_head)}")
    return float(B * H * per_head[op])


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
