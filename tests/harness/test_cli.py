"""The CLI end to end: errors with exit code 2 and no record, a real tiny run, leaderboard, wandb."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from harness.cli import app
from tests.harness.wandb_log import wait_for_exit

runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.chdir(tmp_path)


def _records(results: Path):
    return sorted((results / "runs").glob("*/*.json")) if (results / "runs").exists() else []


def test_list_shows_mixers_tasks_backends(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the suite sets it for the kernel tests
    out = runner.invoke(app, ["list"])
    assert out.exit_code == 0, out.output
    for name in ("softmax", "linear", "gla", "deltanet", "gdn", "lin_gdn", "mesa", "mqar", "triton", "flash_attn"):
        assert name in out.output
    if not torch.cuda.is_available():
        assert "no CUDA device" in out.output


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--mixer", "gdnn", "--task", "mqar"], "Did you mean 'gdn'"),
        (["--mixer", "gdn", "--task", "mqr"], "Did you mean 'mqar'"),
        (["--mixer", "gdn", "--task", "mqar", "--set", "optim.lrr=1"], "valid keys"),
        (["--mixer", "gdn", "--task", "mqar", "--set", "optim.lr=fast"], "optim.lr"),
        (["--mixer", "gdn", "--task", "mqar", "--preset", "nope"], "valid presets"),
        (["--mixer", "gdn", "--task", "mqar", "--set", "model.mixer.heads=2"], "heads"),
        # a task that does not take the mixer refuses it before any run (and before linear runs)
        (["--mixer", "linear,gla", "--task", "fidelity", "--preset", "tiny"], "Valid mixers: lin_gdn, linear"),
    ],
)
def test_bad_input_exit_2_and_no_record(tmp_path, args, needle):
    out = runner.invoke(app, ["run", *args, "--results", str(tmp_path / "res"), "--no-wandb"])
    assert out.exit_code == 2, out.output
    assert needle in out.output.replace("\n", " ")
    assert "Traceback" not in out.output
    assert _records(tmp_path / "res") == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_missing_is_clear(tmp_path):
    out = runner.invoke(app, ["run", "--mixer", "softmax", "--task", "mqar", "--device", "cuda", "--results", str(tmp_path)])
    assert out.exit_code == 2
    assert "no CUDA device" in out.output and "Traceback" not in out.output


def test_tiny_run_records_leaderboard_and_wandb(tmp_path):
    res = tmp_path / "res"
    out = runner.invoke(app, ["run", "--mixer", "softmax,linear", "--task", "mqar", "--preset", "tiny", "--device", "cpu",
                              "--results", str(res)])
    assert out.exit_code == 0, out.output
    recs = [json.loads(p.read_text()) for p in _records(res)]
    assert sorted(r["mixer"] for r in recs) == ["linear", "softmax"]
    for r in recs:
        assert r["status"] == "ok" and r["error"] is None
        assert 0.0 <= r["metrics"]["accuracy"] <= 1.0
        assert r["backend"] == "torch"
        assert r["config"]["model"]["d_model"] == 32
        assert r["device"].startswith("cpu")
        assert r["versions"]["torch"] == torch.__version__
    # one wandb offline run per record, named after it, with the final metrics in its summary
    logs = list((tmp_path / "wandb").rglob("offline-run-*/run-*.wandb"))
    assert len(logs) == 2
    ids = {r["wandb"]["id"] for r in recs}
    for log in logs:
        records = wait_for_exit(log)
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert run.run_id in ids
        summary = {i.key for r in records if r.WhichOneof("record_type") == "summary" for i in r.summary.update}
        assert "accuracy" in summary and "test/accuracy" not in summary

    out = runner.invoke(app, ["leaderboard", "--results", str(res)])
    assert out.exit_code == 0, out.output
    md = (res / "LEADERBOARD.md").read_text()
    assert "softmax" in md and "linear" in md and "mqar" in md


def test_diverging_run_writes_diverged_record(tmp_path):
    res = tmp_path / "res"
    # a learning rate this large makes the loss non-finite: the run diverges, the record says so
    out = runner.invoke(app, ["run", "--mixer", "linear", "--task", "mqar", "--preset", "tiny", "--device", "cpu",
                              "--set", "optim.lr=1e30", "--set", "optim.grad_clip=1e30", "--results", str(res), "--no-wandb"])
    assert out.exit_code == 1, out.output
    (rec,) = [json.loads(p.read_text()) for p in _records(res)]
    assert rec["status"] == "diverged" and "TrainingDiverged" in rec["error"]
    assert "1 of 1 run(s) diverged" in out.output


def test_wandb_run_holds_config_curve_image_and_record(tmp_path):
    """The offline run read back: config with device, versions and commit; a loss curve of
    several points; the heatmap as an image; the record as an artifact; names both ways."""
    res = tmp_path / "res"
    out = runner.invoke(app, ["run", "--mixer", "linear", "--task", "niah", "--preset", "tiny", "--device", "cpu",
                              "--results", str(res), "--log-every", "1"])
    assert out.exit_code == 0, out.output
    (path,) = _records(res)
    rec = json.loads(path.read_text())
    (log,) = (tmp_path / "wandb").rglob("offline-run-*/run-*.wandb")
    records = wait_for_exit(log)
    kinds = [r.WhichOneof("record_type") for r in records]
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == f"linear·niah·s0·{rec['config_hash'][:8]}" and run.job_type == "niah"
    assert rec["wandb"]["id"] == run.run_id and rec["wandb"]["path"].endswith(run.run_id)
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["device"] == rec["device"] and config["git_commit"] == rec["git_commit"]
    assert config["versions"]["torch"] == torch.__version__
    assert config["record"] == f"runs/niah/{rec['run_id']}.json"
    assert config["optim"] == rec["config"]["optim"]
    history = [{i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    loss_steps = [int(h["_step"]) for h in history if "train/loss" in h]
    assert len(loss_steps) > 1 and loss_steps == sorted(set(loss_steps))
    assert any(k.startswith("plots/niah_heatmap") for h in history for k in h)
    assert list((log.parent / "files" / "media" / "images").rglob("niah_heatmap*.png"))
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    (record_artifact,) = [a for a in artifacts if a.type == "run-record"]
    assert record_artifact.name == f"record-{rec['run_id']}"
    assert [e.path for e in record_artifact.manifest.contents] == [path.name]
    assert "exit" in kinds


def test_log_every_must_be_positive(tmp_path):
    out = runner.invoke(app, ["run", "--mixer", "linear", "--task", "mqar", "--preset", "tiny", "--log-every", "0",
                              "--results", str(tmp_path / "res"), "--no-wandb"])
    assert out.exit_code == 2 and "log-every" in out.output


def test_leaderboard_fits_100_columns(tmp_path, monkeypatch):
    """The committed records' boards at COLUMNS=100: no line wider, no column cut to a bare '…'."""
    import shutil

    repo = Path(__file__).resolve().parents[2]
    shutil.copytree(repo / "results" / "runs", tmp_path / "res" / "runs")
    monkeypatch.setenv("COLUMNS", "100")
    out = runner.invoke(app, ["leaderboard", "--results", str(tmp_path / "res")])
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if set(line) & set("│┃┏┗┡└")]  # the tables' lines
    assert lines and max(len(line) for line in lines) <= 100
    cells = [c.strip() for line in lines for c in line.replace("┃", "│").split("│")]
    assert "…" not in cells and not any(c.endswith("…") for c in cells)
    assert "mqar · preset zoology" in out.output and "more column(s) of this table in LEADERBOARD.md" in out.output
