"""Run records: schema, atomic writing, loading."""

import json
import os

import pytest
import torch

from harness.records import SCHEMA, RunRecord, UnreadableRecordWarning, load_records, write_record


def make_record(**over):
    base = dict(
        run_id="r1", config_hash="abc", mixer="softmax", task="mqar", preset="tiny", config={"a": 1},
        metrics={"accuracy": 0.5}, backend="torch", device="cpu: test", versions={"torch": "x"},
        git_commit=None, seed=0, started="2026-01-01T00:00:00+00:00", finished="2026-01-01T00:00:01+00:00",
        duration_s=1.0, status="ok",
    )
    base.update(over)
    return RunRecord(**base)


def test_schema_keys(tmp_path):
    path = write_record(tmp_path, make_record())
    data = json.loads(path.read_text())
    required = {"schema", "run_id", "mixer", "task", "config", "metrics", "backend", "device", "versions",
                "git_commit", "seed", "started", "finished", "status", "error"}
    assert required <= set(data)
    assert data["schema"] == SCHEMA
    assert path == tmp_path / "runs" / "mqar" / "r1.json"


def test_round_trip(tmp_path):
    write_record(tmp_path, make_record(run_id="a"))
    write_record(tmp_path, make_record(run_id="b", status="failed", error="boom", metrics={}))
    recs = {r.run_id: r for _, r in load_records(tmp_path)}
    assert set(recs) == {"a", "b"}
    assert recs["b"].status == "failed" and recs["b"].error == "boom"


def test_unknown_status_rejected():
    with pytest.raises(ValueError):
        make_record(status="maybe")


def test_atomic_write_leaves_nothing_on_failure(tmp_path, monkeypatch):
    write_record(tmp_path, make_record(run_id="keep"))

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        write_record(tmp_path, make_record(run_id="lost"))
    files = sorted(p.name for p in (tmp_path / "runs" / "mqar").iterdir())
    assert files == ["keep.json"], "no temp file and no half record left behind"


def test_torn_file_is_skipped_with_a_warning_naming_it(tmp_path):
    write_record(tmp_path, make_record(run_id="good"))
    (tmp_path / "runs" / "mqar" / "torn.json").write_text('{"schema": "harness.run/1", "run_')
    with pytest.warns(UnreadableRecordWarning, match=r"skipped .*torn\.json: not a readable run record"):
        assert [r.run_id for _, r in load_records(tmp_path)] == ["good"]


def test_leaderboard_warns_about_an_unreadable_record_and_refuses_a_missing_folder(tmp_path):
    from typer.testing import CliRunner

    from harness.cli import app

    write_record(tmp_path, make_record(run_id="good"))
    (tmp_path / "runs" / "mqar" / "torn.json").write_text("{")
    out = CliRunner().invoke(app, ["leaderboard", "--results", str(tmp_path)])
    assert out.exit_code == 0, out.output
    text = "".join(out.output.split())  # the line as printed, whatever Python's warning filters say
    assert "warning:skipped" in text and "torn.json:notareadablerunrecord" in text
    missing = CliRunner().invoke(app, ["leaderboard", "--results", str(tmp_path / "nosuch")])
    assert missing.exit_code == 2 and "is not a directory" in missing.output
    assert not (tmp_path / "nosuch").exists()


def test_commit_is_the_one_the_process_started_with(tmp_path, monkeypatch):
    """A tree edited (or committed) while runs go on in one process must not relabel them: every
    run of the process carries the commit of its first run's start."""
    import harness.envinfo as envinfo
    from harness.config import resolve_config
    from harness.runner import RunSpec, execute
    from harness.tracking import Tracker
    from tasks import get_task

    commits = iter(["aaaaaaa", "bbbbbbb", "ccccccc"])
    monkeypatch.setattr(envinfo, "git_commit", lambda: next(commits))
    envinfo.process_commit.cache_clear()
    try:
        task = get_task("mqar")
        spec = RunSpec("linear", task, "tiny", resolve_config(task, "tiny", None, []), torch.device("cpu"), 0)
        first, _ = execute(spec, tmp_path, Tracker(enabled=False))
        second, _ = execute(spec, tmp_path, Tracker(enabled=False))
    finally:
        envinfo.process_commit.cache_clear()
    assert first.git_commit == second.git_commit == "aaaaaaa"


def test_compare_names_a_corrupt_record_file_and_warns_about_one_in_a_folder(tmp_path):
    from harness.compare import CompareError, load_side

    write_record(tmp_path, make_record(run_id="good"))
    torn = tmp_path / "runs" / "mqar" / "torn.json"
    torn.write_text("{")
    with pytest.raises(CompareError, match=r"torn\.json is not a readable run record"):
        load_side(torn)
    with pytest.warns(UnreadableRecordWarning, match="torn.json"):
        assert load_side(tmp_path).count == 1


def test_prepare_results_refuses_a_file_and_cleans_orphan_temp_records(tmp_path):
    from harness.records import ORPHAN_AGE_S, prepare_results

    a_file = tmp_path / "notadir"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is a file; give a directory"):
        prepare_results(a_file)
    write_record(tmp_path, make_record(run_id="good"))
    old = tmp_path / "runs" / "mqar" / ".r0.abc.tmp"
    fresh = tmp_path / "runs" / "mqar" / ".r1.def.tmp"
    old.write_text("{")
    fresh.write_text("{")
    stale = old.stat().st_mtime - 2 * ORPHAN_AGE_S
    os.utime(old, (stale, stale))
    assert prepare_results(tmp_path) == 1
    assert not old.exists() and fresh.exists(), "a temp file being written right now is left alone"
    assert [r.run_id for _, r in load_records(tmp_path)] == ["good"]


def test_run_with_results_pointing_at_a_file_exits_2_before_training(tmp_path):
    from typer.testing import CliRunner

    from harness.cli import app

    a_file = tmp_path / "results.json"
    a_file.write_text("{}")
    out = CliRunner().invoke(app, ["run", "--mixer", "linear", "--task", "mqar", "--preset", "tiny", "--no-wandb",
                                   "--results", str(a_file)])
    assert out.exit_code == 2 and "is a file" in out.output


def test_sigterm_stops_a_run_like_ctrl_c(tmp_path):
    """`harness` under SIGTERM mid-training: exit 130 (the handler ran), no record, no temp file."""
    import signal
    import subprocess
    import sys

    env = {**os.environ, "WANDB_MODE": "disabled", "HARNESS_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-c", "from harness.cli import main; main()", "run", "--mixer", "gdn", "--task", "mqar",
           "--preset", "default", "--no-wandb", "--device", "cpu", "--results", str(tmp_path / "res")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The data stage's line is printed as training starts: the handler is installed by then.
    for line in proc.stdout:
        if "generating or loading the data" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert not list((tmp_path / "res" / "runs").rglob("*.json")) and not list((tmp_path / "res").rglob("*.tmp"))


def test_table_rows_takes_lists_of_flat_dicts_only():
    from harness.tracking import table_rows

    rows = [{"T": 512, "ms": 0.4, "status": "ok"}, {"T": 1024, "ms": None}]
    assert table_rows(rows) == rows
    assert table_rows([]) is None and table_rows({"T": 1}) is None and table_rows([1, 2]) is None
    assert table_rows([{"T": 1, "nested": {"a": 1}}]) is None
