"""`--runs-per-gpu N` of the gpus executor, without a GPU: the worker environments and labels
(CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS, no per-worker Triton cache), local_gpu_executor on a
fake set of GPUs, what reaches the worker processes, and the option's validation (exit 2)."""

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.executors import ExecutorError, Job, WorkerPoolExecutor, gpu_slot_envs, local_gpu_executor, make_executor
from tests.harness.test_sweep import SMOKE, app, cli  # the sweep CLI as harness.cli registers it

# A stand-in worker: says hello, then answers each job with the environment it runs in.
FAKE_WORKER = r"""
import json, os, sys
print(json.dumps({"hello": "fake device"}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "TRITON_CACHE_DIR", "HARNESS_WORKER_LABEL")}
    outcome = {"key": job["config_hash"], "status": "ok", "record": None, "error": json.dumps(env),
               "duration_s": 0.0, "where": env["HARNESS_WORKER_LABEL"]}
    print(json.dumps({"outcome": outcome}), flush=True)
"""


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)


def _job(i: int, results: Path) -> Job:
    return Job(config_hash=f"h{i}", mixer="softmax", task="mqar", preset="tiny", config={}, seed=0,
               device_type="cuda", results=str(results))


def test_slot_envs_and_labels():
    envs, labels = gpu_slot_envs(["0", "1"], 2, cpu_count=16, environ={})
    assert labels == ["gpu0.1", "gpu0.2", "gpu1.1", "gpu1.2"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "0", "1", "1"]
    assert all(e["OMP_NUM_THREADS"] == "4" for e in envs)  # 16 CPUs / 4 workers
    assert all("TRITON_CACHE_DIR" not in e for e in envs)  # one cache for the workers of a GPU
    # one worker per GPU keeps the labels it always had
    envs, labels = gpu_slot_envs(["3", "5"], 1, cpu_count=16, environ={})
    assert labels == ["gpu3", "gpu5"] and [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3", "5"]
    assert all(e["OMP_NUM_THREADS"] == "8" for e in envs)


def test_omp_threads_floor_and_the_users_own_setting():
    envs, _ = gpu_slot_envs(["0"], 3, cpu_count=2, environ={})
    assert [e["OMP_NUM_THREADS"] for e in envs] == ["1", "1", "1"]  # never 0
    envs, _ = gpu_slot_envs(["0"], 2, cpu_count=None, environ={})  # os.cpu_count() may be None
    assert [e["OMP_NUM_THREADS"] for e in envs] == ["1", "1"]
    envs, _ = gpu_slot_envs(["0"], 2, cpu_count=64, environ={"OMP_NUM_THREADS": "3"})
    assert all("OMP_NUM_THREADS" not in e for e in envs)  # inherited from the sweep's environment as set


@pytest.mark.parametrize("n", [0, -1, 1.5, True])
def test_runs_per_gpu_below_one_is_refused(n, tmp_path):
    with pytest.raises(ExecutorError, match="--runs-per-gpu must be an integer of at least 1"):
        gpu_slot_envs(["0"], n, cpu_count=8, environ={})
    with pytest.raises(ExecutorError, match="--runs-per-gpu"):
        local_gpu_executor(tmp_path, wandb=False, runs_per_gpu=n)


def test_other_executors_refuse_runs_per_gpu(tmp_path):
    for kind in ("inprocess", "ray"):
        with pytest.raises(ExecutorError, match=f"--runs-per-gpu 2 works only with --executor gpus, not --executor {kind}"):
            make_executor(kind, "cpu", tmp_path, wandb=False, runs_per_gpu=2)
    assert make_executor("inprocess", "cpu", tmp_path, wandb=False, runs_per_gpu=1).slots == 1


def test_local_gpu_executor_on_fake_gpus(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setattr("os.cpu_count", lambda: 12)
    pool = local_gpu_executor(tmp_path / "logs", wandb=False, runs_per_gpu=3)
    assert pool.slots == 6 and pool.device_type == "cuda"
    assert [w.label for w in pool.workers] == ["gpu3.1", "gpu3.2", "gpu3.3", "gpu5.1", "gpu5.2", "gpu5.3"]
    assert [w.env for w in pool.workers] == [{"CUDA_VISIBLE_DEVICES": g, "OMP_NUM_THREADS": "2"} for g in "333555"]
    assert "3 per GPU" in pool.where and "gpu5.3" in pool.where
    assert all(w.proc is None for w in pool.workers)  # workers start on the first job, not here
    pool.close()


@pytest.mark.parametrize("cache", [None, "shared-cache"])
def test_workers_get_their_gpu_and_one_triton_cache(tmp_path, monkeypatch, cache):
    if cache:
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / cache))
    envs, labels = gpu_slot_envs(["0", "1"], 2, cpu_count=8)
    pool = WorkerPoolExecutor(envs, labels, "cuda", tmp_path / "logs", wandb=False, argv=[sys.executable, "-c", FAKE_WORKER])
    try:
        for i in range(pool.slots):
            pool.submit(_job(i, tmp_path))
        outcomes, deadline = [], time.monotonic() + 60
        while len(outcomes) < pool.slots and time.monotonic() < deadline:
            outcomes += pool.poll(1.0)
    finally:
        pool.close()
    seen = {o.where: json.loads(o.error) for o in outcomes}
    assert sorted(seen) == ["gpu0.1", "gpu0.2", "gpu1.1", "gpu1.2"]
    for label, env in seen.items():
        assert env["CUDA_VISIBLE_DEVICES"] == label[3] and env["OMP_NUM_THREADS"] == "2"
        assert env["TRITON_CACHE_DIR"] == (str(tmp_path / cache) if cache else None)


def test_cli_refuses_runs_per_gpu_with_another_executor(tmp_path):
    res = tmp_path / "res"
    out = cli.invoke(app, ["sweep", str(SMOKE), "--executor", "inprocess", "--runs-per-gpu", "2", "--results", str(res)])
    assert out.exit_code == 2, out.output
    text = " ".join(out.output.split())
    assert "--runs-per-gpu 2 works only with --executor gpus" in text and "valid values" in text
    assert "Traceback" not in out.output and not res.exists()
    out = cli.invoke(app, ["sweep", str(SMOKE), "--executor", "gpus", "--runs-per-gpu", "0", "--results", str(res)])
    assert out.exit_code == 2, out.output
    assert "--runs-per-gpu must be an integer of at least 1" in " ".join(out.output.split()) and not res.exists()
    out = cli.invoke(app, ["sweep", str(SMOKE), "--executor", "gpus", "--runs-per-gpu", "2", "--dry-run", "--results", str(res)])
    assert out.exit_code == 0 and "to run" in out.output, out.output


BUSY_WORKER = r"""
import json, subprocess, sys, time
print(json.dumps({"hello": "fake device"}), flush=True)
for line in sys.stdin:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[1], "w").write(str(child.pid))
    time.sleep(600)  # a run that does not end by itself
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    except OSError:
        return False


def test_abort_stops_a_busy_worker_and_its_children(tmp_path):
    """Stopping a sweep kills the worker of a run in flight and what that run started (compile
    workers), at once, instead of waiting on them."""
    pid_file = tmp_path / "child.pid"
    envs, labels = gpu_slot_envs(["0"], 1, cpu_count=2)
    pool = WorkerPoolExecutor(envs, labels, "cuda", tmp_path / "logs", wandb=False,
                              argv=[sys.executable, "-c", BUSY_WORKER, str(pid_file)])
    pool.submit(_job(0, tmp_path))
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        pool.poll(0.2)
    worker_pid, child_pid = pool.workers[0].proc.pid, int(pid_file.read_text())
    assert _alive(worker_pid) and _alive(child_pid)
    started = time.monotonic()
    pool.abort()
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 10
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker_pid) and not _alive(child_pid)
    assert all(w.proc is None for w in pool.workers)


def test_a_worker_prints_its_stacks_on_sigusr1(tmp_path):
    # A stalled run is diagnosed without stopping it: SIGUSR1 makes the worker write every
    # thread's Python stack to its log (stderr) and carry on.
    import signal
    import subprocess

    log = tmp_path / "worker.log"
    env = {**os.environ, "HARNESS_WORKER_DEVICE": "cpu", "HARNESS_WORKER_LABEL": "w0"}
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "harness.executors"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env=env)
        try:
            assert json.loads(proc.stdout.readline())["hello"]  # set up, waiting for a job
            proc.send_signal(signal.SIGUSR1)
            deadline = time.time() + 30
            while "worker_main" not in log.read_text() and time.time() < deadline:
                time.sleep(0.1)
            assert proc.poll() is None  # still running
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)
    text = log.read_text()
    # the stack's header reads "Current thread 0x..." or, when the signal lands while another
    # thread runs, "Thread 0x..."
    assert re.search(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\)", text, re.M), text[-2000:]
    assert "in worker_main" in text, text[-2000:]
    assert proc.returncode == 0
