"""`harness sweep --where KEY=VALUE`: a selection of the grid by its `set`/`vary` values keeps
the whole grid's run keys (so it resumes and fills the same sweep), compares numbers as
numbers, and refuses a malformed condition, a key the sweep lacks or a selection of nothing,
naming what the sweep has."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.sweep import SweepError, expand, load_sweep, select_keys, select_where

GRID = Path(__file__).resolve().parents[2] / "configs" / "mqar-paper.yaml"


@pytest.fixture(scope="module")
def plan():
    return expand(load_sweep(GRID), "cuda")


def test_selection_keeps_the_grid_keys(plan):
    chosen = select_where(plan, ["model.d_model=256", "optim.lr=0.01"])
    assert len(chosen.points) == 7  # the seven mixers
    grid = {p.key: p for p in plan.points}
    for point in chosen.points:
        assert point.key in grid
        values = dict(point.overrides)
        assert values["model.d_model"] == 256 and values["optim.lr"] == pytest.approx(0.01)
    assert [p.key for p in chosen.points] == [p.key for p in plan.points if p in chosen.points]  # grid order


def test_numbers_compare_as_numbers(plan):
    a = select_where(plan, ["optim.lr=3.162e-3"]).points
    b = select_where(plan, ["optim.lr=0.003162"]).points
    assert [p.key for p in a] == [p.key for p in b] and len(a) == 21


def test_a_list_of_values_selects_any_of_them(plan):
    chosen = select_where(plan, ["model.d_model=256", "optim.lr=0.001, 3.162e-3"]).points
    assert len(chosen) == 14  # seven mixers x two lrs
    assert {round(dict(p.overrides)["optim.lr"], 6) for p in chosen} == {0.001, 0.003162}
    single = {p.key for p in select_where(plan, ["model.d_model=256", "optim.lr=0.001"]).points}
    assert single < {p.key for p in chosen}


@pytest.mark.parametrize("condition, message", [
    ("optim.lr=0.001,", r"an empty value in the list.*0\.001"),
    ("model.d_model", r"give KEY=VALUE.*model\.d_model: 64, 128, 256"),
    ("=256", r"give KEY=VALUE"),
    ("model.n_layers=2", r"model\.n_layers is not a `set` or `vary` key of this sweep.*optim\.lr: 0\.01"),
    ("model.d_model=512", r"no run of the sweep matches.*model\.d_model: 64, 128, 256"),
])
def test_bad_conditions_are_refused_by_name(plan, condition, message):
    with pytest.raises(SweepError, match=message):
        select_where(plan, [condition])


def test_cli_where_dry_run(tmp_path):
    from harness.cli import app

    result = CliRunner().invoke(app, ["sweep", str(GRID), "--dry-run", "--executor", "gpus", "--results",
                                      str(tmp_path), "--where", "model.d_model=256", "--mixer", "gdn"])
    assert result.exit_code == 0, result.output
    assert "mqar-paper: 4 run(s)" in result.output and result.output.count("to run") == 4  # empty results
    bad = CliRunner().invoke(app, ["sweep", str(GRID), "--dry-run", "--executor", "gpus", "--results",
                                   str(tmp_path), "--where", "model.width=256"])
    assert bad.exit_code == 2 and "model.width is not a `set` or `vary` key" in bad.output


def test_dry_run_says_which_runs_resume(tmp_path, monkeypatch):
    """A run whose cut-short training state waits under <results>/.resume shows as resuming."""
    from rich.console import Console

    import harness.sweep_view as sweep_view

    plan = select_where(expand(load_sweep(GRID), "cuda", None, ["gdn"]), ["model.d_model=256"])
    state = tmp_path / ".resume" / "mqar" / plan.points[0].key
    state.mkdir(parents=True)
    (state / "train_state.pt").write_bytes(b"stand-in")
    wide = Console(width=300, record=True)
    monkeypatch.setattr(sweep_view, "console", wide)
    sweep_view.print_plan(plan, tmp_path)
    rows = [line for line in wide.export_text().splitlines() if "mqar" in line and "zoology" in line]
    assert len(rows) == 4
    assert "to run, resumes" in rows[0] and all("to run" in r and "resumes" not in r for r in rows[1:])


def test_keys_select_in_the_order_given(plan):
    last, first = plan.points[-1].key, plan.points[0].key
    chosen = select_keys(plan, [last[:8], first[:10].upper()]).points
    assert [p.key for p in chosen] == [last, first]


@pytest.mark.parametrize("prefix, message", [
    ("abc", r"at least 6 hex digits"), ("zzzzzzzz", r"at least 6 hex digits"),
    ("ffffffffffff", r"no run of this selection"),
])
def test_bad_keys_are_refused(plan, prefix, message):
    with pytest.raises(SweepError, match=message):
        select_keys(plan, [prefix])


def test_an_ambiguous_prefix_is_refused(plan):
    from types import SimpleNamespace

    from harness.sweep import Plan

    twins = [SimpleNamespace(key=f"abcdef{i:010x}") for i in range(2)]  # select_keys reads only .key
    with pytest.raises(SweepError, match=r"2 runs have keys starting so; give more digits"):
        select_keys(Plan(plan.name, plan.device, twins, plan.duplicates), ["abcdef"])
