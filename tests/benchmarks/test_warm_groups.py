"""benchmarks/warm_groups.py: the compile groups of the next runs of the paper grid, skipping
runs that have an ok record, each group once, in the sweep's order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.warm_groups import next_groups
from harness.sweep import SweepError, expand, load_sweep, select_where

GRID = Path(__file__).resolve().parents[2] / "configs" / "mqar-paper.yaml"


def _fake_ok_record(results: Path, point) -> None:
    """A record the sweep counts as done for `point` (its resolved config, status ok)."""
    folder = results / "runs" / point.task
    folder.mkdir(parents=True, exist_ok=True)
    record = {"schema": "harness.run/1", "run_id": f"x-{point.config_hash}", "config_hash": point.config_hash,
              "mixer": point.mixer, "task": point.task, "preset": point.preset, "config": point.config,
              "metrics": {}, "details": {}, "backend": "torch", "device": "NVIDIA H200", "versions": {},
              "git_commit": None, "seed": point.seed, "started": "2026-01-01T00:00:00+00:00",
              "finished": "2026-01-01T00:00:01+00:00", "duration_s": 1.0, "status": "ok", "error": None}
    (folder / f"x-{point.config_hash}.json").write_text(json.dumps(record))


def test_groups_of_the_next_runs(tmp_path):
    assert next_groups(GRID, tmp_path, 3) == ["softmax:64", "linear:64", "gla:64"]
    assert next_groups(GRID, tmp_path, 4, ["gdn"], ["model.d_model=256"]) == ["gdn:256"]
    plan = select_where(expand(load_sweep(GRID), "cuda", None, ["gdn"]), ["model.d_model=256"])
    for point in plan.points:
        _fake_ok_record(tmp_path, point)
    assert next_groups(GRID, tmp_path, 4, ["gdn"], ["model.d_model=256"]) == []
    assert next_groups(GRID, tmp_path, 2, ["gdn", "mesa"], ["model.d_model=256"]) == ["mesa:256"]


def test_keys_give_the_groups_in_their_order(tmp_path):
    plan = expand(load_sweep(GRID), "cuda")
    mesa_256 = next(p for p in plan.points if p.mixer == "mesa" and p.config["model"]["d_model"] == 256)
    gla_64 = next(p for p in plan.points if p.mixer == "gla" and p.config["model"]["d_model"] == 64)
    keys = [mesa_256.key[:8], gla_64.key[:8]]
    assert next_groups(GRID, tmp_path, 4, keys=keys) == ["mesa:256", "gla:64"]
    _fake_ok_record(tmp_path, mesa_256)
    assert next_groups(GRID, tmp_path, 4, keys=keys) == ["gla:64"]


def test_a_bad_selection_is_refused():
    with pytest.raises(SweepError, match="model.width is not a `set` or `vary` key"):
        next_groups(GRID, Path("/nonexistent"), 4, None, ["model.width=3"])


def test_group_point_gives_the_config_the_group_runs():
    """The warm-up's --sweep config: the preset and overrides of the group's first run resolve
    to that run's config, so the graphs it compiles are the runs' own."""
    from benchmarks.warm_groups import group_point
    from harness.config import resolve_config
    from harness.sweep import set_item
    from tasks.mqar import MQAR

    point = group_point(GRID, "gdn", 256)
    assert point.mixer == "gdn" and point.config["model"]["d_model"] == 256
    cfg = resolve_config(MQAR, point.preset, None, [set_item(k, v) for k, v in point.overrides])
    assert cfg.model_dump(mode="json") == point.config and cfg.optim.compile is True
    with pytest.raises(SweepError, match="no run of gdn at d_model 512"):
        group_point(GRID, "gdn", 512)
