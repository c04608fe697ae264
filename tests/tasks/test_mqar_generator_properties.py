"""Property tests of the MQAR generator over random settings and seeds: the invariants every
sequence must hold, whatever the shape (Zoology's construction, values distinct)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.mqar_data import make_mqar


@st.composite
def _settings(draw):
    vocab = draw(st.sampled_from([16, 64, 256, 8192]))
    kv = draw(st.integers(1, min(16, vocab // 2 - 1)))
    seq_len = draw(st.integers(2 * kv + 2 * kv, 2 * kv + 2 * kv + 40))  # room for kv queries
    return draw(st.integers(1, 6)), seq_len, kv, vocab, draw(st.integers(0, 2**31 - 1)), draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(_settings())
def test_every_sequence_holds_the_mqar_invariants(setting):
    n, seq_len, kv, vocab, seed, random_non_queries = setting
    inputs, labels = make_mqar(n, seq_len, kv, vocab, seed, random_non_queries=random_non_queries)
    assert inputs.shape == labels.shape == (n, seq_len) and inputs.dtype == labels.dtype == np.int64
    assert inputs.min() >= 0 and inputs.max() < vocab
    half = vocab // 2
    for x, y in zip(inputs, labels):
        keys, values = x[0 : 2 * kv : 2], x[1 : 2 * kv : 2]
        # keys from the lower half without token 0, values from the upper half, each distinct
        assert ((keys >= 1) & (keys < half)).all() and ((values >= half) & (values < vocab)).all()
        assert len(set(keys)) == kv and len(set(values)) == kv
        assert (y[: 2 * kv] == -100).all(), "nothing is scored inside the key-value context"
        scored = np.flatnonzero(y != -100)
        assert len(scored) == kv, "every key is queried exactly once"
        bound = dict(zip(keys.tolist(), values.tolist()))
        queried = x[scored]
        assert sorted(queried.tolist()) == sorted(keys.tolist())
        # the label at a query position is the value bound to the queried key
        assert [bound[k] for k in queried.tolist()] == y[scored].tolist()


@settings(max_examples=20, deadline=None)
@given(_settings())
def test_the_same_seed_gives_the_same_data_and_another_seed_other_data(setting):
    n, seq_len, kv, vocab, seed, random_non_queries = setting
    a = make_mqar(n, seq_len, kv, vocab, seed, random_non_queries=random_non_queries)
    b = make_mqar(n, seq_len, kv, vocab, seed, random_non_queries=random_non_queries)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    if vocab >= 256 and kv >= 4:  # enough entropy that two seeds agreeing is (practically) impossible
        c = make_mqar(n, seq_len, kv, vocab, seed + 1, random_non_queries=random_non_queries)
        assert not np.array_equal(a[0], c[0])
