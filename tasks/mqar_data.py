"""Multi-query associative recall data, following Zoology's MQAR layout.

A sequence of length L starts with `num_kv_pairs` key-value pairs (k1 v1 k2 v2 ...): keys
from the lower half of the vocabulary (token 0 excluded), values from the upper half,
keys distinct and values distinct within a sequence (as Zoology draws them). Every key is then queried once in the rest of the
sequence, at even offsets whose distance from the context follows a power law
p(gap) ~ a * gap^(a-1) (short gaps likely). The label at a query's position is its value;
all other labels are -100. Positions that are neither context nor query hold random
filler tokens drawn from the whole vocabulary.
"""

from __future__ import annotations

import numpy as np

# 2: values are distinct within a sequence (1 drew them with replacement).
GENERATOR_VERSION = 2


def check_setting(seq_len: int, num_kv_pairs: int, vocab_size: int) -> None:
    """ValueError naming the parameter when a setting cannot be laid out."""
    if num_kv_pairs < 1:
        raise ValueError(f"num_kv_pairs must be >= 1, got {num_kv_pairs}")
    space = (seq_len - 2 * num_kv_pairs) // 2
    if space < num_kv_pairs:
        raise ValueError(
            f"seq_len={seq_len} is too short for num_kv_pairs={num_kv_pairs}: need seq_len >= {4 * num_kv_pairs}"
        )
    if vocab_size // 2 - 1 < num_kv_pairs:
        raise ValueError(
            f"vocab_size={vocab_size} gives {vocab_size // 2 - 1} distinct keys, fewer than num_kv_pairs={num_kv_pairs}"
        )
    # Values come from the upper half, never smaller than the key range: the key check covers them.


def distinct_draws(rng: np.random.Generator, rows: int, count: int, low: int, high: int) -> np.ndarray:
    """[rows, count] int64: each row `count` distinct integers from [low, high), in random order.

    Small draws from a large pool redraw the rows that repeat a number (an i.i.d. row kept only
    when its numbers are distinct is a uniform ordered subset); large draws take the `count`
    smallest of uniform scores over the pool, in chunks of rows to bound memory."""
    pool = high - low
    if count * count <= pool:
        out = rng.integers(low, high, size=(rows, count))
        while True:
            ordered = np.sort(out, axis=1)
            repeats = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
            if repeats.size == 0:
                return out
            out[repeats] = rng.integers(low, high, size=(repeats.size, count))
    out = np.empty((rows, count), dtype=np.int64)
    chunk = max(1, (1 << 22) // pool)
    for r0 in range(0, rows, chunk):
        scores = rng.random((min(chunk, rows - r0), pool))
        picked = np.argpartition(scores, count - 1, axis=1)[:, :count] if count < pool else np.argsort(scores, axis=1)
        order = np.argsort(np.take_along_axis(scores, picked, axis=1), axis=1)
        out[r0 : r0 + len(scores)] = np.take_along_axis(picked, order, axis=1) + low
    return out


def make_mqar(
    num_examples: int, seq_len: int, num_kv_pairs: int, vocab_size: int, seed: int,
    power_a: float = 0.01, random_non_queries: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Generate MQAR sequences. Returns (inputs, labels), both int64 [num_examples, seq_len]."""
    check_setting(seq_len, num_kv_pairs, vocab_size)
    rng = np.random.default_rng(seed)
    n, kv = num_examples, num_kv_pairs
    half = vocab_size // 2

    # Distinct keys per row: the first kv of a random permutation of 1..half-1.
    keys = distinct_draws(rng, n, kv, 1, half)
    values = distinct_draws(rng, n, kv, half, vocab_size)
    context = np.empty((n, 2 * kv), dtype=np.int64)
    context[:, 0::2], context[:, 1::2] = keys, values

    # Query gaps without replacement, weighted by the power law (Gumbel top-k sampling).
    space = (seq_len - 2 * kv) // 2
    j = np.arange(1, space + 1, dtype=np.float64)
    log_p = np.log(power_a) + (power_a - 1.0) * np.log(j)
    scores = log_p[None, :] + rng.gumbel(size=(n, space))
    gaps = np.argsort(-scores, axis=1)[:, :kv]

    # The tail holds one extra token so inputs and labels can be shifted by one.
    tail = np.zeros((n, seq_len + 1 - 2 * kv), dtype=np.int64)
    np.put_along_axis(tail, 2 * gaps, keys, axis=1)
    seq = np.concatenate([context, tail], axis=1)
    label_seq = np.full((n, seq_len + 1), -100, dtype=np.int64)
    np.put_along_axis(label_seq, 2 * kv + 2 * gaps + 1, values, axis=1)

    inputs, labels = seq[:, :-1].copy(), label_seq[:, 1:].copy()
    if random_non_queries:
        filler = np.zeros_like(inputs, dtype=bool)
        filler[:, 2 * kv :] = True
        np.put_along_axis(filler, 2 * kv + 2 * gaps, False, axis=1)
        inputs[filler] = rng.integers(0, vocab_size, size=int(filler.sum()))
    return inputs, labels
