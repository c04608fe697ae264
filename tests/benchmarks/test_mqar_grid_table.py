"""benchmarks.mqar_grid_table.busy_minutes: device time the grid's records span."""
from types import SimpleNamespace

import pytest

from benchmarks.mqar_grid_table import busy_minutes


def _rec(started: str, finished: str) -> SimpleNamespace:
    return SimpleNamespace(started=f"2026-12-04T{started}+00:00", finished=f"2026-12-04T{finished}+00:00")


def test_overlapping_spans_count_once_and_gaps_not_at_all():
    records = [
        _rec("10:00:00", "10:10:00"),  # packed beside the next one
        _rec("10:05:00", "10:12:00"),
        _rec("10:06:00", "10:08:00"),  # inside both
        _rec("11:00:00", "11:03:30"),  # after a gap of 48 minutes
    ]
    assert busy_minutes(records) == pytest.approx(12 + 3.5)


def test_order_does_not_matter_and_nothing_is_zero():
    a, b = _rec("09:00:00", "09:30:00"), _rec("09:20:00", "09:45:00")
    assert busy_minutes([b, a]) == pytest.approx(45)
    assert busy_minutes([]) == 0
