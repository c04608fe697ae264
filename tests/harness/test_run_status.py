"""Record statuses that say what happened: diverged for a non-finite run, and `learned`
for a trained run whose loss never left the chance level."""

from __future__ import annotations

import math

import pytest
import torch

from harness.config import resolve_config
from harness.leaderboard import build_boards, to_markdown
from harness.records import load_records
from harness.runner import RunSpec, execute
from harness.tracking import Tracker
from tasks import get_task
from tasks.base import LEARNED_BELOW, TaskResult, learned_metrics
from tasks.common.training import TrainingDiverged


def _spec(task_name="mqar", mixer="linear", sets=()):
    task = get_task(task_name)
    return RunSpec(mixer, task, "tiny", resolve_config(task, "tiny", None, list(sets)), torch.device("cpu"), 0)


def test_a_diverging_run_is_recorded_as_diverged(tmp_path, monkeypatch):
    spec = _spec()

    def diverge(self, ctx):
        raise TrainingDiverged("loss became nan at step 7 (epoch 0); try a lower lr")

    monkeypatch.setattr(spec.task, "run", diverge)
    record, path = execute(spec, tmp_path, Tracker(enabled=False))
    assert record.status == "diverged" and "step 7" in record.error
    assert [r.status for _, r in load_records(tmp_path)] == ["diverged"]


def test_other_errors_stay_failed(tmp_path, monkeypatch):
    spec = _spec()
    monkeypatch.setattr(spec.task, "run", lambda self, ctx: (_ for _ in ()).throw(RuntimeError("boom")))
    record, _ = execute(spec, tmp_path, Tracker(enabled=False))
    assert record.status == "failed" and "boom" in record.error


@pytest.mark.parametrize("task_name, chance", [("mqar", math.log(64)), ("niah", math.log(32))])
def test_chance_loss_is_uniform_over_the_answers(task_name, chance):
    spec = _spec(task_name)  # tiny presets: MQAR vocabulary 128 (64 values), NIAH 32 values
    assert spec.task.chance_loss(spec.config) == pytest.approx(chance)


def test_learned_compares_the_final_loss_with_chance():
    spec = _spec()
    chance = spec.task.chance_loss(spec.config)
    at_chance = learned_metrics(spec.task, spec.config, {"final_loss": 0.99 * chance})
    assert at_chance == {"chance_loss": chance, "learned": 0.0}
    assert learned_metrics(spec.task, spec.config, {"final_loss": (LEARNED_BELOW - 0.01) * chance})["learned"] == 1.0
    assert learned_metrics(spec.task, spec.config, {"accuracy": 1.0}) == {}
    assert learned_metrics(get_task("throughput"), _spec("throughput").config, {"final_loss": 1.0}) == {}


def test_a_run_at_chance_is_flagged_in_its_record_and_the_leaderboard(tmp_path, monkeypatch):
    spec = _spec()
    chance = spec.task.chance_loss(spec.config)
    monkeypatch.setattr(spec.task, "run", lambda self, ctx: TaskResult({"accuracy": 0.01, "final_loss": chance}, "torch"))
    record, _ = execute(spec, tmp_path, Tracker(enabled=False))
    assert record.status == "ok" and record.metrics["learned"] == 0.0
    boards, count = build_boards(tmp_path)
    assert "| linear (at chance) |" in to_markdown(boards, count, tmp_path)


def test_a_real_tiny_run_records_learned(tmp_path):
    record, _ = execute(_spec(), tmp_path, Tracker(enabled=False))
    assert record.status == "ok" and record.metrics["learned"] in (0.0, 1.0)
    assert record.metrics["chance_loss"] == pytest.approx(math.log(64))


def test_the_leaderboard_flags_an_old_record_at_chance_from_its_loss(tmp_path, monkeypatch):
    """Records written before `learned` existed are judged from final_loss and their config."""
    spec = _spec()
    chance = spec.task.chance_loss(spec.config)
    monkeypatch.setattr(spec.task, "run", lambda self, ctx: TaskResult({"accuracy": 0.01, "final_loss": chance}, "torch"))
    _, path = execute(spec, tmp_path, Tracker(enabled=False))
    import json

    data = json.loads(path.read_text())
    del data["metrics"]["learned"], data["metrics"]["chance_loss"]
    path.write_text(json.dumps(data))
    boards, count = build_boards(tmp_path)
    assert "| linear (at chance) |" in to_markdown(boards, count, tmp_path)


def test_heads_that_do_not_split_the_width_are_refused_before_the_run(tmp_path):
    from typer.testing import CliRunner

    from harness.cli import app
    from mixers.base import MixerConfig, layer_widths

    assert layer_widths(32, MixerConfig(num_heads=4)) == (8, 8)
    assert layer_widths(32, MixerConfig(num_heads=3, head_dim=10)) == (10, 10)  # explicit widths are the user's
    with pytest.raises(ValueError, match="valid num_heads: 1, 2, 4, 8, 16, 32"):
        layer_widths(32, MixerConfig(num_heads=3))
    out = CliRunner().invoke(app, ["run", "--mixer", "gdn", "--task", "mqar", "--preset", "tiny", "--no-wandb",
                                   "--set", "model.mixer.num_heads=3", "--results", str(tmp_path)])
    assert out.exit_code == 2 and "does not split the key width" in " ".join(out.output.split())
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", [".inf", "1e99999", ".nan"])
def test_non_finite_numbers_are_refused_before_the_run(tmp_path, value):
    from typer.testing import CliRunner

    from harness.cli import app

    out = CliRunner().invoke(app, ["run", "--mixer", "gdn", "--task", "mqar", "--preset", "tiny", "--no-wandb",
                                   "--set", f"optim.lr={value}", "--results", str(tmp_path)])
    assert out.exit_code == 2 and "optim.lr" in out.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("backend, why", [("magic", "is not valid"), ("flash_attn", "cannot run on cpu")])
def test_a_backend_that_cannot_run_here_is_refused_before_the_run(tmp_path, backend, why):
    from typer.testing import CliRunner

    from harness.cli import app

    out = CliRunner().invoke(app, ["run", "--mixer", "softmax", "--task", "mqar", "--preset", "tiny", "--no-wandb",
                                   "--device", "cpu", "--set", f"model.mixer.backend={backend}", "--results", str(tmp_path)])
    assert out.exit_code == 2 and why in " ".join(out.output.split())
    assert not (tmp_path / "runs").exists()


def test_the_leaderboard_has_date_and_commit_columns(tmp_path, monkeypatch):
    import harness.runner as runner_module

    monkeypatch.setattr(runner_module, "process_commit", lambda: "0123456789abcdef")
    execute(_spec(), tmp_path, Tracker(enabled=False))
    boards, count = build_boards(tmp_path)
    md = to_markdown(boards, count, tmp_path)
    header = next(line for line in md.splitlines() if line.startswith("| mixer"))
    assert "| date | commit |" in header
    row = next(line for line in md.splitlines() if line.startswith("| linear"))
    assert "| 0123456789 |" in row and f"| {load_records(tmp_path).__next__()[1].finished[:10]} |" in row


def test_python_dash_m_harness_prints_the_version():
    import subprocess
    import sys

    from harness import __version__

    out = subprocess.run([sys.executable, "-m", "harness", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"harness {__version__}"


@pytest.mark.parametrize("task, setting, why", [
    ("lm", "corpus=/no/such/corpus", "is neither a file nor a folder"),
    ("mqar", "optim.cuda_graph=true", "cuda_graph=true needs a CUDA device"),
    ("niah", "optim.cuda_graph=true", "cuda_graph=true needs a CUDA device"),
    ("throughput", "mixer.num_heads=7", "are task fields here"),
    ("memory", "softmax.head_dim=7", "are task fields here"),
])
def test_task_settings_that_cannot_run_are_refused_before_the_run(tmp_path, task, setting, why):
    from typer.testing import CliRunner

    from harness.cli import app

    out = CliRunner().invoke(app, ["run", "--mixer", "gdn", "--task", task, "--preset", "tiny", "--no-wandb",
                                   "--device", "cpu", "--set", setting, "--results", str(tmp_path)])
    assert out.exit_code == 2 and why in " ".join(out.output.split()), out.output
    assert not list(tmp_path.rglob("*.json"))


def test_a_sweep_point_that_cannot_run_is_refused_with_the_whole_grid():
    from harness.sweep import SweepError, SweepFile, expand

    sweep = SweepFile(mixers=["gdn"], presets=["tiny"], grid=[{"tasks": ["lm"], "set": {"corpus": "/no/such/corpus"}}])
    with pytest.raises(SweepError, match="is neither a file nor a folder"):
        expand(sweep, "cpu")


def test_a_memory_run_whose_every_probe_runs_out_is_oom_not_ok(tmp_path):
    record, _ = execute(_spec("memory", "gdn", ["max_bytes=1"]), tmp_path, Tracker(enabled=False))
    assert record.status == "oom" and "every probe of gdn" in record.error and "max_bytes" in record.error


def test_a_cuda_out_of_memory_error_is_status_oom(tmp_path, monkeypatch):
    spec = _spec()

    def oom(self, ctx):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(spec.task, "run", oom)
    record, _ = execute(spec, tmp_path, Tracker(enabled=False))
    assert record.status == "oom" and "20.00 GiB" in record.error


def test_a_shown_metric_that_is_also_an_extra_appears_once(tmp_path, monkeypatch):
    spec = _spec("niah", "gdn")
    metrics = {"accuracy": 0.5, "accuracy_train_len": 0.6, "accuracy_longest": 0.4, "params": 1.0, "train_time_s": 2.0}
    monkeypatch.setattr(spec.task, "run", lambda self, ctx: TaskResult(metrics, "torch"))
    execute(spec, tmp_path, Tracker(enabled=False))
    (board,), _ = build_boards(tmp_path)
    assert len(board.columns) == len(set(board.columns)) and "accuracy_train_len" in board.columns


def test_dashboard_out_that_cannot_be_written_exits_2(tmp_path):
    from typer.testing import CliRunner

    from harness.cli import app
    from harness.records import write_record
    from tests.harness.test_records import make_record

    write_record(tmp_path, make_record())
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    out = CliRunner().invoke(app, ["dashboard", "--results", str(tmp_path), "--out", str(blocker / "dash")])
    assert out.exit_code == 2 and "cannot write the page there" in " ".join(out.output.split())


def test_eval_of_a_record_without_a_checkpoint_names_the_record(tmp_path):
    from harness.records import write_record
    from tasks.common.checkpoint import resolve_checkpoint_path
    from tests.harness.test_records import make_record

    record = write_record(tmp_path, make_record(run_id="run"))
    with pytest.raises(ValueError, match=r"run\.json' has no artifact folder .* saved no checkpoint"):
        resolve_checkpoint_path(record)


def test_boards_join_cpus_for_accuracy_and_split_them_for_timings(tmp_path):
    from harness.records import write_record
    from tests.harness.test_records import make_record

    for i, cpu in enumerate(("cpu: AMD EPYC 7B13", "cpu: Intel Xeon 8480")):
        write_record(tmp_path, make_record(run_id=f"m{i}", mixer=["gdn", "linear"][i], device=cpu))
        write_record(tmp_path, make_record(run_id=f"t{i}", task="throughput", preset="default", device=cpu,
                                           metrics={"fwdbwd_tokens_per_s": 1.0 + i}))
    boards, _ = build_boards(tmp_path)
    by_task = {}
    for b in boards:
        by_task.setdefault(b.task, []).append(b.device)
    assert by_task["mqar"] == ["cpu"]
    assert sorted(by_task["throughput"]) == ["cpu: AMD EPYC 7B13", "cpu: Intel Xeon 8480"]


def test_mqar_boards_split_by_width_best_lr_at_each(tmp_path, monkeypatch):
    """One MQAR table per d_model (the task's board_split), each with the best lr of a mixer at
    that width, widths in numeric order."""
    task = get_task("mqar")
    accuracy = {(64, 1e-2): 0.5, (64, 1e-3): 0.6, (128, 1e-2): 0.9, (128, 1e-3): 0.8}
    for (width, lr), acc in accuracy.items():
        spec = _spec(sets=[f"model.d_model={width}", f"optim.lr={lr}"])
        monkeypatch.setattr(task, "run", lambda self, ctx, acc=acc: TaskResult({"accuracy": acc}, "torch"))
        execute(spec, tmp_path, Tracker(enabled=False))
    boards, count = build_boards(tmp_path)
    assert count == 4
    assert [b.setting.split(" · ", 1)[1] for b in boards] == ["d_model 64", "d_model 128"]
    assert [(b.rows[0]["accuracy"], b.rows[0]["runs"]) for b in boards] == [(0.6, 2), (0.9, 2)]
    assert "optim.lr=0.001" in boards[0].rows[0]["config"] and "d_model 64" in to_markdown(boards, count, tmp_path)
