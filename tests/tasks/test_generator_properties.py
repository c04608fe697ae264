"""Property tests of the MQAR and NIAH generators over random settings and seeds: the
invariants every sequence must hold, whatever the shape."""

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


@st.composite
def _niah_cases(draw):
    from tasks.niah_data import NIAHVariant, NIAHVocab

    keys = draw(st.integers(1, 4))
    variant = NIAHVariant(name="v", haystack=draw(st.sampled_from(["repeat", "random"])), keys=keys,
                          values_per_key=draw(st.integers(1, 3)), queries=draw(st.integers(1, keys)),
                          value_len=draw(st.integers(1, 4)))
    vocab = NIAHVocab(num_keys=8, num_values=16, num_filler=12, pattern_len=draw(st.integers(1, 12)))
    shortest = 1 + variant.query_len() + variant.num_needles * (2 + variant.value_len)
    return variant, vocab, draw(st.integers(shortest, shortest + 60)), draw(st.integers(0, 2**31 - 1))


@settings(max_examples=60, deadline=None)
@given(_niah_cases())
def test_every_niah_sequence_scores_its_answers_and_only_them(case):
    from tasks.niah_data import make_niah

    variant, vocab, seq_len, seed = case
    block = make_niah(variant, 3, seq_len, vocab, seed)
    assert block.inputs.shape == block.labels.shape == block.answer_ids.shape == (3, seq_len)
    assert block.inputs.min() >= 0 and block.inputs.max() < vocab.size
    assert ((block.answer_depths >= 0) & (block.answer_depths <= 1)).all()
    for x, y, ids in zip(block.inputs, block.labels, block.answer_ids):
        scored = np.flatnonzero(y != -100)
        assert np.array_equal(scored, np.flatnonzero(ids >= 0)), "scored positions are exactly the answers' tokens"
        assert sorted(ids[scored].tolist()) == sorted(list(range(variant.num_answers)) * variant.value_len)
        assert ((y[scored] >= vocab.value_start) & (y[scored] < vocab.filler_start)).all(), "answers are value tokens"
        for pos in scored:  # a model can only recall what it has seen: each answer token occurs earlier
            assert y[pos] in x[:pos].tolist()
