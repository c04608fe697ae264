"""The generated-data cache gives back exactly what was generated, on first use and after."""

import numpy as np
import pytest

from tasks.common import datacache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    return tmp_path


def test_round_trip_keeps_values_shapes_and_dtypes(cache_dir):
    rng = np.random.default_rng(0)
    arrays = {
        "inputs": rng.integers(0, 8192, size=(37, 19)),
        "labels": np.where(rng.random((37, 19)) < 0.5, -100, rng.integers(0, 8192, size=(37, 19))),
        "depths": rng.random(37),
    }
    calls = []

    def make():
        calls.append(1)
        return {k: v.copy() for k, v in arrays.items()}

    first = datacache.cached_arrays("unit", {"seed": 1}, make)
    again = datacache.cached_arrays("unit", {"seed": 1}, make)
    assert len(calls) == 1, "the second call must load, not generate"
    for got in (first, again):
        assert set(got) == set(arrays)
        for name, want in arrays.items():
            assert got[name].shape == want.shape and got[name].dtype == want.dtype, name
            np.testing.assert_array_equal(got[name], want)


def test_another_spec_is_another_entry(cache_dir):
    a = datacache.cached_arrays("unit", {"seed": 1}, lambda: {"x": np.zeros((2, 3), dtype=np.int64)})
    b = datacache.cached_arrays("unit", {"seed": 2}, lambda: {"x": np.ones((2, 3), dtype=np.int64)})
    assert a["x"].sum() == 0 and b["x"].sum() == 6
    assert len([p for p in (cache_dir / "unit").iterdir() if not p.name.startswith(".")]) == 2


def test_rows_of_unequal_length_come_back_as_rows(cache_dir):
    ragged = {"x": np.array([np.arange(3), np.arange(5)], dtype=object)}
    datacache.cached_arrays("unit", {"seed": 3}, lambda: ragged)
    got = datacache.cached_arrays("unit", {"seed": 3}, lambda: pytest.fail("must load"))
    assert got["x"].dtype == object and [list(r) for r in got["x"]] == [[0, 1, 2], [0, 1, 2, 3, 4]]
