"""The FLOP-count pieces the op specs share (the convention is tasks/common/flops.py's docstring).

A matrix product [m, k] x [k, n] costs 2 m n k; elementwise work is not counted. The linear
ops are counted in their chunkwise form with chunk length C, the intra-chunk products in full.
"""

from __future__ import annotations

# Forward+backward over forward: softmax's backward has 5 products against the forward's 2;
# every other product Y = AB needs dA and dB.
FWDBWD_SOFTMAX = 3.5
FWDBWD_CHUNKED = 3.0


def chunk_sizes(T: int, C: int) -> list[tuple[int, int]]:
    """[(number of chunks, chunk length)]: T // C full chunks and one remainder chunk."""
    if T < 1 or C < 1:
        raise ValueError(f"chunk_sizes: need T >= 1 and C >= 1, got T={T}, C={C}")
    out = [(T // C, C)] if T >= C else []
    if T % C:
        out.append((1, T % C))
    return out


def chunked(per_chunk, B: int, T: int, H: int, chunk_size: int) -> float:
    """B H times the sum of per_chunk(c) over the chunks of T tokens."""
    return float(B * H * sum(n * per_chunk(c) for n, c in chunk_sizes(T, chunk_size)))


def softmax_forward(B: int, T: int, H: int, K: int, V: int, cache_len: int = 0) -> float:
    """Causal softmax attention of T new queries after `cache_len` cached keys.

    Per head: the T x cache block is full (2 T S (K+V)), the T x T block half (T^2 (K+V))."""
    return float(B * H * (K + V) * (T * T + 2 * T * cache_len))


def linear_chunk(c: int, K: int, V: int) -> float:
    """One chunk of (gated) linear attention."""
    # Q S (2cKV) + Q K^T (2c^2 K) + scores V (2c^2 V) + state update K^T V (2cKV).
    return 4 * c * K * V + 2 * c * c * (K + V)


def delta_chunk(c: int, K: int, V: int) -> float:
    """One chunk of the (gated) delta rule in its WY form."""
    # A = K K^T (2c^2 K); Tm = (I + A)^-1 by forward substitution (c^3 / 3);
    # W = Tm (beta K) (2c^2 K); U0 = Tm (beta V) (2c^2 V); U = U0 - W S (2cKV);
    # O = Q S (2cKV) + (Q K^T) (2c^2 K) U (2c^2 V); S' = S + K^T U (2cKV).
    return c**3 / 3 + 6 * c * c * K + 4 * c * c * V + 6 * c * K * V


def mesa_chunk(c: int, K: int, V: int, cg_steps: int) -> float:
    """One chunk of MesaNet with `cg_steps` CG iterations."""
    # H_kv path as gated linear attention with q* as the query (linear_chunk), the H_kk
    # state update K^T K (2cK^2), and per CG iteration one mat-vec for all c tokens:
    # P H0 (2cK^2) + (P K^T) (2c^2 K) times K (2c^2 K).
    return linear_chunk(c, K, V) + 2 * c * K * K + cg_steps * (2 * c * K * K + 4 * c * c * K)



def linear_forward(B: int, T: int, H: int, K: int, V: int, chunk_size: int = 64, **_) -> float:
    """Forward of (gated) linear attention, chunkwise."""
    return chunked(lambda c: linear_chunk(c, K, V), B, T, H, chunk_size)


def delta_forward(B: int, T: int, H: int, K: int, V: int, chunk_size: int = 64, **_) -> float:
    """Forward of the (gated) delta rule, chunkwise; also the linearized softmax GDN, which runs
    on it after O(T (K + V)) elementwise preprocessing."""
    return chunked(lambda c: delta_chunk(c, K, V), B, T, H, chunk_size)
