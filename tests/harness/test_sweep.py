"""Sweeps: grid expansion and run keys, validation before anything runs, resume after
SIGKILL (configs/smoke-cpu.yaml, what CI runs), two sweeps on one results directory,
failed runs recorded while the sweep goes on, and worker processes that die mid-run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

import tasks.registry
from harness.config import config_hash, resolve_config
from harness.executors import InProcessExecutor, WorkerPoolExecutor
from harness.sweep import SweepError, SweepFile, expand, load_sweep, run_sweep
from harness.sweep_cli import compare_cmd, sweep_cmd
from tasks import get_task

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "configs" / "smoke-cpu.yaml"

app = typer.Typer()
app.command("sweep")(sweep_cmd)  # as harness.cli registers them
app.command("compare")(compare_cmd)
cli = CliRunner()

# A test task: sleeps (or kills its own process). Defined as source so that subprocesses
# (sweeps, worker processes) can register it too.
NAP_TASK = """
import os, time
from pydantic import Field
from tasks.base import Task, TaskConfig, TaskResult

class NapConfig(TaskConfig):
    seconds: float = Field(0.1, ge=0)
    crash: bool = False

class Nap(Task):
    description = "test task: sleeps, or kills its own process"
    Config = NapConfig
    primary_metric = "nap_ms"
    higher_is_better = False

    def run(self, ctx):
        if ctx.config.crash:
            os._exit(7)
        t0 = time.perf_counter()
        time.sleep(ctx.config.seconds)
        return TaskResult(metrics={"nap_ms": 1000 * (time.perf_counter() - t0)}, backend="none")
"""
REGISTER_NAP = NAP_TASK + "\nfrom tasks.registry import register_task\nregister_task('nap')(Nap)\n"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "disabled")


@pytest.fixture
def nap(monkeypatch):
    space: dict = {}
    exec(NAP_TASK, space)
    cls = space["Nap"]
    cls.name = "nap"
    get_task("mqar")  # load the registry before adding to it
    monkeypatch.setitem(tasks.registry._TASKS, "nap", cls)
    return cls


def _records(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((results / "runs").glob("*/*.json"))]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_grid_expansion_and_stable_keys(tmp_path):
    sweep = SweepFile(**{
        "mixers": ["softmax", "gdn"], "seeds": [0, 1], "set": {"optim.epochs": 2},
        "grid": [
            {"tasks": "mqar", "presets": ["tiny"], "vary": {"optim.lr": [1e-3, 3e-3]}},
            {"tasks": ["mqar"], "presets": "tiny", "mixers": "gdn", "seeds": 0, "set": {"optim.lr": 1e-3}},  # duplicates
        ],
    })
    plan = expand(sweep, "cpu")
    assert len(plan.points) == 8 and plan.duplicates == 1
    assert [(p.mixer, p.seed) for p in plan.points[:4]] == [("softmax", 0), ("softmax", 1), ("gdn", 0), ("gdn", 1)]
    again = expand(sweep, "cpu")
    assert [p.key for p in again.points] == [p.key for p in plan.points]
    assert len({p.key for p in plan.points}) == 8
    # the key is the config hash `harness run --set ...` writes into its record, plus the device type
    p = plan.points[0]
    cfg = resolve_config(get_task("mqar"), "tiny", None, ["optim.epochs=2", "optim.lr=1e-3"]).model_dump(mode="json")
    assert p.config == cfg and p.key == f"{config_hash('softmax', 'mqar', cfg, 0)}-cpu"
    assert expand(sweep, "cuda").points[0].key.endswith("-cuda")
    assert {q.config["optim"]["lr"] for q in plan.points} == {1e-3, 3e-3}
    only = expand(sweep, "cpu", only_mixers=["gdn"])
    assert {q.mixer for q in only.points} == {"gdn"} and len(only.points) == 4
    with pytest.raises(SweepError, match=r"--mixer nosuch: not a mixer of this sweep \(its mixers: gdn, softmax\)"):
        expand(sweep, "cpu", only_mixers=["nosuch"])


def test_invalid_grid_exits_2_and_runs_nothing(tmp_path):
    bad = _write(tmp_path / "bad.yaml", "mixers: [gdnn]\ngrid:\n  - tasks: [mqar, mqr]\n    presets: [tiny, huge]\n"
                                        "    set: {optim.lrr: 1}\n")
    out = cli.invoke(app, ["sweep", str(bad), "--results", str(tmp_path / "res")])
    assert out.exit_code == 2, out.output
    text = " ".join(out.output.split())
    needles = ("Did you mean 'gdn'", "Did you mean 'mqar'", "unknown key 'optim.lrr'", "unknown preset 'huge'", "nothing was run")
    for needle in needles:
        assert needle in text
    assert not (tmp_path / "res").exists()
    shape = _write(tmp_path / "shape.yaml", "grid: [{tasks: [mqar]}]\nmixer: gdn\n")
    out = cli.invoke(app, ["sweep", str(shape), "--results", str(tmp_path / "res")])
    assert out.exit_code == 2 and "mixer" in out.output and "valid keys" in " ".join(out.output.split())
    out = cli.invoke(app, ["sweep", str(SMOKE), "--dry-run", "--results", str(tmp_path / "res")])
    assert out.exit_code == 0 and "to run" in out.output and "softmax" in out.output
    assert not (tmp_path / "res").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_gpus_executor_says_there_is_no_gpu(tmp_path):
    out = cli.invoke(app, ["sweep", str(SMOKE), "--executor", "gpus", "--results", str(tmp_path / "res")])
    assert out.exit_code == 2
    text = " ".join(out.output.split())
    assert "no CUDA GPU" in text and "--executor inprocess" in text and "Traceback" not in out.output


def test_sigkill_mid_run_then_resume(tmp_path):
    """CI's smoke sweep: killed while its second run is in flight, then resumed."""
    res = tmp_path / "res"
    env = {**os.environ, "HARNESS_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "harness.sweep_cli", "sweep", str(SMOKE), "--results", str(res), "--no-wandb"],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    locks = res / ".sweep" / "locks"
    def second_run_in_flight() -> bool:
        done = [json.loads(p.read_text())["config_hash"] for p in res.glob("runs/*/*.json")]
        claims = [p.name for p in locks.glob("*.lock")] if done else []
        return any(not name.startswith(done[0]) for name in claims)

    # kill once the first record is written and the second run holds its claim
    while not second_run_in_flight():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "the sweep made no record in time"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = _records(res)
    assert len(first) == 1 and first[0]["status"] == "ok"
    assert list(locks.glob("*.lock"))  # the killed run's claim file stays behind, unlocked

    out = cli.invoke(app, ["sweep", str(SMOKE), "--results", str(res), "--no-wandb"])
    assert out.exit_code == 0, out.output
    assert "1 done before" in " ".join(out.output.split())
    plan = expand(load_sweep(SMOKE), "cpu")
    recs = _records(res)
    assert sorted(f"{r['config_hash']}-cpu" for r in recs) == sorted(p.key for p in plan.points)  # one each, none doubled
    assert all(r["status"] == "ok" for r in recs) and first[0] in recs
    assert not list(locks.glob("*.lock"))
    # CI's gate on the smoke records: against themselves nothing regresses
    out = cli.invoke(app, ["compare", str(res), str(res)])
    assert out.exit_code == 0, out.output


DRIVER = REGISTER_NAP + """
import sys, time
from pathlib import Path
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.01)
from harness.sweep_cli import app
app(sys.argv[3:])
"""


def test_two_sweeps_at_once_lose_nothing_and_double_nothing(tmp_path, nap):
    grid = _write(tmp_path / "naps.yaml", "mixers: [softmax, gdn]\nseeds: [0, 1, 2, 3]\n"
                                          "grid: [{tasks: [nap], set: {seconds: 0.4}}]\n")
    res, go = tmp_path / "res", tmp_path / "go"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    procs = [
        subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / f"ready{i}"), str(go), "sweep", str(grid),
                          "--results", str(res), "--no-wandb"],
                         cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for i in range(2)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    go.touch()  # both start the same grid at the same moment
    outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    recs = _records(res)
    keys = [r["config_hash"] for r in recs]
    assert len(recs) == 8 and len(set(keys)) == 8 and all(r["status"] == "ok" for r in recs)
    expected = {p.config_hash for p in expand(load_sweep(grid), "cpu").points}
    assert set(keys) == expected
    ran_here = [sum(line.startswith("✓") for line in out.splitlines()) for out in outputs]
    assert sum(ran_here) == 8 and min(ran_here) >= 1, outputs  # both did part of the work


def test_failed_runs_are_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    mqar_run = get_task("mqar").run

    def run_or_oom(self, ctx):
        if ctx.config.optim.epochs == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        if ctx.config.optim.epochs == 3:
            raise RuntimeError("bogus failure at run time")
        return mqar_run(self, ctx)

    monkeypatch.setattr(get_task("mqar"), "run", run_or_oom)
    small = {"train": [{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 128}],  # two steps
             "test": [{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 16}]}
    sweep = SweepFile(**{"mixers": ["gdn"], "presets": ["tiny"], "set": small, "grid": [
        {"tasks": ["mqar"], "set": {"optim.lr": 1.0e30}},  # the loss goes NaN
        {"tasks": ["mqar"], "set": {"optim.epochs": 3}},  # fails at run time (patched)
        {"tasks": ["mqar"], "set": {"optim.epochs": 2}},  # out of memory (patched)
        {"tasks": ["mqar"]},
    ]})
    plan, res = expand(sweep, "cpu"), tmp_path / "res"
    summary = run_sweep(plan, InProcessExecutor("cpu", wandb=False), res)
    assert [o.status for _, o in summary.ran] == ["diverged", "failed", "oom", "ok"]
    errors = [o.error for _, o in summary.ran]
    assert "nan" in errors[0].lower() and "bogus" in errors[1] and "OutOfMemoryError" in errors[2]
    assert len(_records(res)) == 4 and len(summary.failed) == 3

    # A diverged run is an outcome of its settings: done, not retried.
    again = run_sweep(plan, InProcessExecutor("cpu", wandb=False), res)
    assert again.ran == [] and again.done_before == 2 and len(again.failed_before) == 2
    monkeypatch.setattr(get_task("mqar"), "run", mqar_run)  # the memory is back, the failure fixed
    retry = run_sweep(plan, InProcessExecutor("cpu", wandb=False), res, retry_failed=True)
    assert [o.status for _, o in retry.ran] == ["ok", "ok"]
    recs = _records(res)
    assert len(recs) == 6 and sum(r["status"] == "ok" for r in recs) == 3


def test_a_lost_cuda_context_stops_the_sweep_with_a_clear_error(tmp_path, monkeypatch):
    """A sticky CUDA error (here emptying the cache raises, as after an illegal address)
    ends the in-process sweep with an ExecutorError naming the run, its record and how to
    resume, not a traceback."""
    from harness.executors import GpuContextLost, Job, Outcome, release_gpu_after_failure

    def lost(*_):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "empty_cache", lost)
    job = Job(config_hash="h", mixer="lin_gdn", task="kernels", preset="gpu", config={}, seed=0,
              device_type="cuda", results=str(tmp_path))
    outcome = Outcome(job.key, "failed", str(tmp_path / "rec.json"), "AcceleratorError", 1.0, "this process")
    with pytest.raises(GpuContextLost, match=r"lin_gdn · kernels/gpu .*illegal memory access.*rec\.json.*run the same") as e:
        release_gpu_after_failure(job, outcome)
    assert e.value.outcome == outcome  # a pool worker reports the run before it ends


def test_worker_that_dies_mid_run_gets_a_failed_record(tmp_path, nap):
    grid = SweepFile(mixers=["gdn"], grid=[{"tasks": ["nap"], "set": {"crash": True}}, {"tasks": ["nap"]}])
    plan, res = expand(grid, "cpu"), tmp_path / "res"
    pool = WorkerPoolExecutor([{}], ["w0"], "cpu", res / ".sweep" / "logs", wandb=False,
                              argv=[sys.executable, "-c",
                                    REGISTER_NAP + "from harness.executors import worker_main\nworker_main()"])
    try:
        summary = run_sweep(plan, pool, res)
    finally:
        pool.close()
    (crashed, o1), (_, o2) = summary.ran
    assert o1.status == "failed" and "exit code 7" in o1.error and crashed.config["crash"]
    assert o2.status == "ok" and o2.where == "w0"  # a fresh worker took the next run
    recs = {r["config_hash"]: r for r in _records(res)}
    assert recs[crashed.config_hash]["status"] == "failed" and recs[crashed.config_hash]["device"].startswith("cpu")
    assert len(recs) == 2


def test_a_record_from_before_a_new_option_still_counts_as_done(tmp_path):
    """A record written before optim.matmul_precision existed is that option's default."""
    from harness.sweep import key_records

    sweep = _write(tmp_path / "s.yaml", "mixers: [linear]\ngrid:\n  - tasks: [mqar]\n    presets: [tiny]\n")
    point = expand(load_sweep(sweep), "cpu").points[0]
    old_config = json.loads(json.dumps(point.config))
    del old_config["optim"]["matmul_precision"]
    old_hash = config_hash(point.mixer, "mqar", old_config, point.seed)
    assert old_hash != point.config_hash
    folder = tmp_path / "res" / "runs" / "mqar"
    folder.mkdir(parents=True)
    record = {"task": "mqar", "mixer": point.mixer, "seed": point.seed, "config": old_config,
              "config_hash": old_hash, "device": "cpu (x86_64)", "status": "ok"}
    (folder / f"20260101T000000-mqar-linear-{old_hash[:8]}-0000.json").write_text(json.dumps(record))
    (folder / "not-a-record.json").write_text("{")
    assert len(key_records(tmp_path / "res", point).ok) == 1
    changed = {**record, "config": {**old_config, "vocab_size": old_config["vocab_size"] * 2}}
    (folder / f"20260101T000000-mqar-linear-{old_hash[:8]}-0000.json").unlink()
    (folder / f"20260101T000001-mqar-linear-{old_hash[:8]}-0001.json").write_text(json.dumps(changed))
    assert key_records(tmp_path / "res", point).ok == ()


def test_no_run_starts_after_the_start_window(tmp_path, nap):
    # One slot, three naps of 0.3 s, a window of 0.1 s: the first runs to its end, the other
    # two are left unstarted (and unrecorded); the same sweep without a window runs them.
    grid = SweepFile(mixers=["gdn"], seeds=[0, 1, 2], grid=[{"tasks": ["nap"], "set": {"seconds": 0.3}}])
    plan, res = expand(grid, "cpu"), tmp_path / "res"
    summary = run_sweep(plan, InProcessExecutor("cpu", wandb=False), res, start_for_s=0.1)
    assert [o.status for _, o in summary.ran] == ["ok"]
    assert [p.seed for p in summary.not_started] == [1, 2] and not summary.failed
    assert len(_records(res)) == 1
    rest = run_sweep(plan, InProcessExecutor("cpu", wandb=False), res)
    assert rest.done_before == 1 and [p.seed for p, _ in rest.ran] == [1, 2] and not rest.not_started


def test_start_for_must_be_positive(tmp_path):
    result = cli.invoke(app, ["sweep", str(SMOKE), "--results", str(tmp_path / "res"), "--start-for", "0"])
    assert result.exit_code == 2 and "--start-for 0" in result.output and "> 0" in result.output
    assert not (tmp_path / "res").exists()
