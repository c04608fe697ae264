"""The NIAH generator (placement, masks, lengths, seeds, variants), exact-match scoring and a
tiny end-to-end run of the task."""

import json

import numpy as np
import pytest
import torch

from tasks.base import RunContext
from tasks.niah import NIAH, NIAHConfig
from tasks.niah_data import (
    NEEDLE,
    QUERY,
    NIAHVariant,
    NIAHVocab,
    answer_correct,
    check_variant,
    make_niah,
)

VOCAB = NIAHVocab(num_keys=16, num_values=32, num_filler=16, pattern_len=4)


def _needles(row):
    """Start positions of the needles in an input row."""
    return np.flatnonzero(row == NEEDLE)


def _is(kind, tokens):
    lo = {"key": VOCAB.key_start, "value": VOCAB.value_start, "filler": VOCAB.filler_start}[kind]
    size = {"key": VOCAB.num_keys, "value": VOCAB.num_values, "filler": VOCAB.num_filler}[kind]
    tokens = np.asarray(tokens)
    return (tokens >= lo) & (tokens < lo + size)


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_single_needle_placed_at_depth(depth):
    v = NIAHVariant(name="single")
    L = 40
    block = make_niah(v, 5, L, VOCAB, seed=1, depths=np.full(5, depth))
    n_fill = v.filler_len(L)
    for x, y in zip(block.inputs, block.labels):
        (start,) = _needles(x)
        assert start == round(depth * n_fill), "filler tokens before the needle = depth x filler length"
        key, value = x[start + 1], x[start + 2]
        assert _is("key", key) and _is("value", value)
        # the query at the very end: QUERY key, and the value is the label at the key
        assert x[L - 2] == QUERY and x[L - 1] == key
        scored = np.flatnonzero(y != -100)
        assert scored.tolist() == [L - 1] and y[L - 1] == value
        context = np.delete(x[: L - 2], [start, start + 1, start + 2])
        assert _is("filler", context).all(), "everything else is haystack"
    np.testing.assert_allclose(block.answer_depths[:, 0], round(depth * n_fill) / n_fill)
    if depth == 1.0:  # the needle ends right before the query
        assert (np.array([_needles(x)[0] for x in block.inputs]) + 3 == L - 2).all()


def test_multitoken_values_teacher_forced():
    v = NIAHVariant(name="uuid", value_len=4)
    L = 30
    block = make_niah(v, 8, L, VOCAB, seed=2)
    for x, y, aid in zip(block.inputs, block.labels, block.answer_ids):
        (start,) = _needles(x)
        value = x[start + 2 : start + 6]
        # inputs end with QUERY key v1 v2 v3; the last value token is only a label
        assert x[L - 5] == QUERY and x[L - 4] == x[start + 1]
        np.testing.assert_array_equal(x[L - 3 :], value[:3])
        np.testing.assert_array_equal(y[L - 4 :], value)
        assert (y[: L - 4] == -100).all()
        assert aid[L - 4 :].tolist() == [0] * 4 and (aid[: L - 4] == -1).all()


def test_multikey_multivalue_multiquery_layout():
    v = NIAHVariant(name="mix", keys=3, values_per_key=2, queries=2, value_len=2)
    L = 80
    block = make_niah(v, 20, L, VOCAB, seed=3)
    assert block.answer_depths.shape == (20, v.num_answers) == (20, 4)
    for x, y, aid in zip(block.inputs, block.labels, block.answer_ids):
        starts = _needles(x)
        assert len(starts) == v.num_needles
        needles = [(x[s + 1], tuple(x[s + 2 : s + 4])) for s in starts]
        assert len({k for k, _ in needles}) == v.keys
        assert len({val[0] for _, val in needles}) == v.num_needles, "value starts distinct"
        # query region: per queried key, QUERY key then its values in order of appearance
        seq = np.append(x, y[-1])  # the full sequence (last token only as a label)
        q_starts = np.flatnonzero(seq == QUERY)
        assert len(q_starts) == v.queries and q_starts[0] == L + 1 - v.query_len()
        queried = []
        for qs in q_starts:
            key = seq[qs + 1]
            queried.append(key)
            expected = [val for k, val in needles if k == key]  # in order of appearance
            got = [tuple(seq[qs + 2 + 2 * j : qs + 4 + 2 * j]) for j in range(v.values_per_key)]
            assert got == expected
        assert len(set(queried)) == v.queries
        # labels are exactly the value tokens of the query region, answers numbered in order
        scored = np.flatnonzero(y != -100)
        assert len(scored) == v.num_answers * v.value_len
        assert np.bincount(aid[aid >= 0]).tolist() == [v.value_len] * v.num_answers
        assert (y[scored] == seq[scored + 1]).all()


def test_repeat_haystack_is_periodic():
    v = NIAHVariant(name="passkey", haystack="repeat")
    block = make_niah(v, 4, 50, VOCAB, seed=4, depths=np.array([0.0, 0.2, 0.7, 1.0]))
    for x in block.inputs:
        (start,) = _needles(x)
        filler = np.delete(x[:-2], [start, start + 1, start + 2]) - VOCAB.filler_start
        np.testing.assert_array_equal(filler, np.arange(len(filler)) % VOCAB.pattern_len)


def test_random_haystack_uses_the_filler_range():
    block = make_niah(NIAHVariant(name="r"), 50, 64, VOCAB, seed=5)
    context = block.inputs[:, :-2]
    fill = context[_is("filler", context)]
    assert len(np.unique(fill)) == VOCAB.num_filler, "all filler tokens occur"


def test_lengths_and_errors():
    v = NIAHVariant(name="mq", keys=4, queries=4)
    need = v.query_len() + v.num_needles * 3
    assert make_niah(v, 2, need, VOCAB, seed=0).inputs.shape == (2, need)
    with pytest.raises(ValueError, match=f"need seq_len >= {need}"):
        check_variant(v, need - 1, VOCAB)
    with pytest.raises(ValueError, match="queries=3 exceeds keys=2"):
        NIAHVariant(name="bad", keys=2, queries=3)
    with pytest.raises(ValueError, match="distinct keys"):
        check_variant(NIAHVariant(name="k", keys=17), 200, VOCAB)
    with pytest.raises(ValueError, match="depths"):
        make_niah(NIAHVariant(name="d"), 2, 20, VOCAB, seed=0, depths=np.array([0.5, 1.5]))


def test_deterministic_for_a_seed_and_different_across_seeds():
    v = NIAHVariant(name="mk", keys=3)
    a = make_niah(v, 10, 40, VOCAB, seed=7)
    b = make_niah(v, 10, 40, VOCAB, seed=7)
    c = make_niah(v, 10, 40, VOCAB, seed=8)
    for name, arr in a.as_dict().items():
        np.testing.assert_array_equal(arr, b.as_dict()[name])
    assert not np.array_equal(a.inputs, c.inputs)


def test_answer_correct_needs_every_token():
    answer_ids = np.array([[-1, 0, 0, 1, 1, -1]])
    correct = np.array([[False, True, True, True, False, False]])
    np.testing.assert_array_equal(answer_correct(correct, answer_ids, 2), [[True, False]])


def test_config_validation():
    with pytest.raises(ValueError, match="unique"):
        NIAHConfig(variants=[{"name": "a"}, {"name": "a"}])
    with pytest.raises(ValueError, match="too short"):
        NIAHConfig(train_len=8, variants=[{"name": "a", "keys": 4, "queries": 4}])
    assert NIAHConfig(**NIAH.presets["default"]).vocab.size == 2 + 64 + 128 + 64


def test_tiny_run_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    variants = [{"name": "single_random"}, {"name": "multiquery", "keys": 2, "queries": 2}]
    cfg = NIAHConfig(**{**NIAH.presets["tiny"], "variants": variants})
    ctx = RunContext(mixer="linear", config=cfg, device=torch.device("cpu"), seed=0, artifact_dir=tmp_path / "art")
    result = NIAH().run(ctx)
    m = result.metrics
    for key in ("accuracy", "accuracy_len48", "accuracy_len96", "accuracy_single_random", "accuracy_multiquery",
                "accuracy_depth0", "accuracy_depth50", "accuracy_depth100", "accuracy_train_len", "accuracy_longest"):
        assert 0.0 <= m[key] <= 1.0, key
    assert m["accuracy"] == pytest.approx(np.mean([m["accuracy_len48"], m["accuracy_len96"]]))
    cells = result.details["cells"]
    assert len(cells) == 2 * 2 * 3
    # single: every answer's depth is the grid depth, so each cell holds test_examples answers
    assert all(c["answers"] == cfg.test_examples for c in cells if c["variant"] == "single_random")
    assert sum(c["answers"] for c in cells if c["variant"] == "multiquery") == 2 * 3 * cfg.test_examples * 2
    assert (tmp_path / "art" / result.artifacts[0]).stat().st_size > 1000
    json.dumps(result.details)
