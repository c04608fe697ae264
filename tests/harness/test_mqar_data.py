"""The MQAR generator: layout, label mask, determinism, disjoint train/test streams."""

import numpy as np
import pytest

from tasks.mqar import MQAR, MQARConfig
from tasks.mqar_data import make_mqar


def test_layout_and_labels():
    L, kv, V = 64, 8, 512
    x, y = make_mqar(200, L, kv, V, seed=1, random_non_queries=False)
    assert x.shape == y.shape == (200, L)
    half = V // 2
    for row_x, row_y in zip(x, y):
        keys, values = row_x[0 : 2 * kv : 2], row_x[1 : 2 * kv : 2]
        assert ((keys >= 1) & (keys < half)).all(), "keys from the lower half, token 0 excluded"
        assert ((values >= half) & (values < V)).all(), "values from the upper half"
        assert len(set(keys.tolist())) == kv, "keys distinct within a sequence"
        scored = np.flatnonzero(row_y != -100)
        assert len(scored) == kv, "every key queried exactly once"
        assert (scored >= 2 * kv).all() and ((scored - 2 * kv) % 2 == 0).all(), "queries at even offsets after the context"
        lookup = dict(zip(keys.tolist(), values.tolist()))
        for pos in scored:
            assert row_y[pos] == lookup[row_x[pos]], "label at a query = the value of the queried key"
        # without random filler everything else in the query region is 0
        rest = np.setdiff1d(np.arange(2 * kv, L), scored)
        assert (row_x[rest] == 0).all()
        assert (row_y[: 2 * kv] == -100).all()


def test_random_filler_keeps_queries():
    x0, y0 = make_mqar(50, 64, 8, 512, seed=3, random_non_queries=False)
    x1, y1 = make_mqar(50, 64, 8, 512, seed=3, random_non_queries=True)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(x0[y0 != -100], x1[y1 != -100])
    np.testing.assert_array_equal(x0[:, :16], x1[:, :16])
    assert (x1[:, 16:] != 0).mean() > 0.9, "filler is random tokens, not zeros"


def test_power_law_prefers_short_gaps():
    _, y = make_mqar(2000, 256, 4, 512, seed=0, random_non_queries=False)
    pos = np.argwhere(y != -100)[:, 1]
    gaps = (pos - 8) // 2
    assert np.mean(gaps < 10) > 0.3, "short gaps much more likely than under a uniform law (10/124)"


def test_deterministic_for_a_seed_and_different_across_seeds():
    a = make_mqar(20, 64, 8, 512, seed=5)
    b = make_mqar(20, 64, 8, 512, seed=5)
    c = make_mqar(20, 64, 8, 512, seed=6)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])


def test_train_and_test_streams_disjoint(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    cfg = MQARConfig(**MQAR.presets["tiny"])
    x_train, _ = MQAR._data(cfg, cfg.train, seed=0, split=0)
    x_test, _ = MQAR._data(cfg, cfg.test, seed=0, split=1)
    train_rows = {tuple(r) for r in x_train.tolist()}
    assert not any(tuple(r) in train_rows for r in x_test.tolist())
    # cached: a second call loads the same arrays from disk
    again, _ = MQAR._data(cfg, cfg.train, seed=0, split=0)
    assert (again == x_train).all()
    assert any((tmp_path / "mqar").iterdir())


@pytest.mark.parametrize("L,kv,V,msg", [(16, 8, 512, "too short"), (64, 8, 12, "distinct keys"), (64, 0, 512, "num_kv_pairs")])
def test_bad_settings(L, kv, V, msg):
    with pytest.raises(ValueError, match=msg):
        make_mqar(4, L, kv, V, seed=0)
