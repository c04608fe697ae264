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


@settings(max_examples=40, deadline=None)
@given(_settings())
def test_mqar_queries_sit_at_even_offsets_after_the_context(setting):
    """Each query is at 2 kv + 2 gap (an even offset from the context's end) and its label is
    on the same position; without random filler every other position after the context is 0."""
    n, seq_len, kv, vocab, seed, _ = setting
    for random_non_queries in (False, True):
        inputs, labels = make_mqar(n, seq_len, kv, vocab, seed, random_non_queries=random_non_queries)
        for x, y in zip(inputs, labels):
            scored = np.flatnonzero(y != -100)
            assert ((scored >= 2 * kv) & ((scored - 2 * kv) % 2 == 0)).all()
            if not random_non_queries:
                rest = np.ones(seq_len, dtype=bool)
                rest[: 2 * kv] = False
                rest[scored] = False
                assert (x[rest] == 0).all()


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 5), low=st.integers(0, 50), pool=st.integers(1, 300), fraction=st.floats(0.0, 1.0),
       seed=st.integers(0, 2**31 - 1))
def test_distinct_draws_are_distinct_and_in_range(rows, low, pool, fraction, seed):
    """Both of distinct_draws' regimes (redrawn i.i.d. rows when count^2 <= pool, smallest
    scores otherwise, the whole pool included): each row `count` distinct numbers of
    [low, low + pool), and the same seed gives the same rows."""
    from tasks.mqar_data import distinct_draws

    count = max(1, round(fraction * pool))
    out = distinct_draws(np.random.default_rng(seed), rows, count, low, low + pool)
    assert out.shape == (rows, count) and out.dtype == np.int64
    assert ((out >= low) & (out < low + pool)).all()
    assert all(len(set(row.tolist())) == count for row in out)
    assert np.array_equal(out, distinct_draws(np.random.default_rng(seed), rows, count, low, low + pool))


def _parse_niah(x: np.ndarray, y: np.ndarray, variant, vocab):
    """The full token sequence of one NIAH example (inputs and the last label), cut into its
    context and query region. Returns (context, [(query key, value tokens)] in query order)."""
    from tasks.niah_data import QUERY

    full = np.append(x, y[-1])
    context, region = full[: len(full) - variant.query_len()], full[len(full) - variant.query_len():]
    per_query = 2 + variant.values_per_key * variant.value_len
    queries = []
    for start in range(0, len(region), per_query):
        part = region[start : start + per_query]
        assert part[0] == QUERY and vocab.key_start <= part[1] < vocab.value_start
        queries.append((int(part[1]), part[2:]))
    return context, queries


@settings(max_examples=60, deadline=None)
@given(_niah_cases())
def test_every_niah_needle_is_where_its_depth_says_and_answers_are_its_values(case):
    """The context is the haystack (exactly filler_len filler tokens; the repeated haystack
    cycles its pattern) with num_needles needles [NEEDLE, key, value tokens] in it, value
    starts distinct; each query [QUERY, key] is followed by the values of that key's needles
    in the order they appear, and those are the scored labels (teacher-forced: each scored
    label is the next input); the depth recorded for an answer is the share of the haystack
    before its needle."""
    from tasks.niah_data import NEEDLE, make_niah

    variant, vocab, seq_len, seed = case
    block = make_niah(variant, 2, seq_len, vocab, seed)
    n_fill = variant.filler_len(seq_len)
    for x, y, ids, depths in zip(block.inputs, block.labels, block.answer_ids, block.answer_depths):
        context, queries = _parse_niah(x, y, variant, vocab)
        is_filler = context >= vocab.filler_start
        assert is_filler.sum() == n_fill
        if variant.haystack == "repeat":
            assert np.array_equal(context[is_filler], vocab.filler_start + np.arange(n_fill) % vocab.pattern_len)
        needles = np.flatnonzero(context == NEEDLE)
        assert len(needles) == variant.num_needles
        by_key: dict[int, list[tuple[np.ndarray, float]]] = {}
        for p in needles:
            key, value = int(context[p + 1]), context[p + 2 : p + 2 + variant.value_len]
            assert ((value >= vocab.value_start) & (value < vocab.filler_start)).all()
            by_key.setdefault(key, []).append((value, is_filler[:p].sum() / n_fill))
        assert len(by_key) == variant.keys and all(len(v) == variant.values_per_key for v in by_key.values())
        firsts = [value[0] for found in by_key.values() for value, _ in found]
        assert len(set(firsts)) == len(firsts), "no two needles share a value start"
        assert len({key for key, _ in queries}) == variant.queries
        scored = np.flatnonzero(y != -100)
        assert (y[scored[scored < seq_len - 1]] == x[scored[scored < seq_len - 1] + 1]).all(), "teacher forcing"
        answer = 0
        for key, values in queries:
            expected = np.concatenate([value for value, _ in by_key[key]])
            assert np.array_equal(values, expected), "a query's values are its key's needles, in order"
            for value, depth in by_key[key]:
                assert np.array_equal(y[ids == answer], value), "an answer's scored labels are its needle's value"
                assert depths[answer] == depth
                answer += 1


@settings(max_examples=30, deadline=None)
@given(_niah_cases(), st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2))
def test_niah_target_depths_are_placed_and_seeds_reproduce(case, targets):
    """Given depths, the target needle (a queried key's) lies at round(depth * filler_len)
    fillers into the haystack; the same seed gives the same block."""
    from tasks.niah_data import make_niah

    variant, vocab, seq_len, seed = case
    block = make_niah(variant, 2, seq_len, vocab, seed, depths=np.array(targets))
    n_fill = variant.filler_len(seq_len)
    for depth, recorded in zip(targets, block.answer_depths):
        assert round(depth * n_fill) / n_fill in recorded.tolist()
    again = make_niah(variant, 2, seq_len, vocab, seed, depths=np.array(targets))
    assert all(np.array_equal(a, b) for a, b in zip(block.as_dict().values(), again.as_dict().values()))
