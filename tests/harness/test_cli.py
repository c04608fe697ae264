"""The CLI end to end: errors with exit code 2 and no record, a real tiny run, leaderboard, wandb."""

import json
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from harness.cli import app

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
    # one wandb offline run per record, holding the logged metrics (the .wandb log is
    # protobuf, where metric names appear as plain strings)
    logs = list((tmp_path / "wandb").rglob("offline-run-*/run-*.wandb"))
    assert len(logs) == 2
    for log in logs:
        # wandb's service process writes the log; on a loaded machine it can land a moment
        # after run.finish() returns, so wait for it (bounded) before reading.
        deadline = time.monotonic() + 60
        blob = log.read_bytes()
        while not (b"test/accuracy" in blob and b"train/loss" in blob) and time.monotonic() < deadline:
            time.sleep(0.5)
            blob = log.read_bytes()
        assert b"test/accuracy" in blob and b"train/loss" in blob, f"{log} holds {len(blob)} bytes"

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
