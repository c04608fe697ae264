"""Where sweep runs happen. Every executor runs a Job through harness.runner.execute, so
the records are the same whichever one ran them:

- InProcessExecutor: one run at a time in this process (CPU, or one GPU).
- WorkerPoolExecutor / local_gpu_executor: one worker process per local GPU (or N with
  runs_per_gpu, sharing that GPU and the user's Triton cache), each seeing only its GPU
  (CUDA_VISIBLE_DEVICES). Workers die with the sweep (PR_SET_PDEATHSIG), and a worker that
  dies mid-run (segfault, OOM killer) gets that run a failed record.
- RayExecutor: a Ray cluster (`ray` is the optional extra `.[ray]`), one GPU per run when the
  cluster has GPUs, one CPU per run otherwise; records and artifacts come back to the driver.

The protocol of an executor: `slots` (runs at once), `submit(job)`, `poll(timeout) ->
[Outcome]` (finished runs), `abort()` (stop everything now), `close()`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol


class ExecutorError(RuntimeError):
    """An executor that cannot run here; the message says why and what to use instead."""


@dataclass(frozen=True)
class Job:
    """One run to make: what the sweep resolved, in JSON-able form."""

    config_hash: str
    mixer: str
    task: str
    preset: str
    config: dict[str, Any]
    seed: int
    device_type: str  # 'cpu' or 'cuda' (the executor's own GPU)
    results: str

    @property
    def key(self) -> str:
        return f"{self.config_hash}-{self.device_type}"  # harness.sweep.SweepPoint.key


@dataclass(frozen=True)
class Outcome:
    """A finished run: its record's status and path (None if no record could be written)."""

    key: str
    status: str  # 'ok', 'failed', 'diverged' or 'oom'
    record: str | None
    error: str | None
    duration_s: float
    where: str  # which worker ran it


class Executor(Protocol):
    name: str
    slots: int
    device_type: str

    def submit(self, job: Job) -> None: ...
    def poll(self, timeout: float) -> list[Outcome]: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...


def run_job(job: Job, results: Path | None = None, wandb: bool = True, progress: Any = None, where: str = "") -> Outcome:
    """Run `job` here and write its record (ok or failed) under `results` (default job.results)."""
    import torch

    from harness.runner import RunSpec, execute
    from harness.tracking import Tracker
    from tasks import get_task

    task = get_task(job.task)
    spec = RunSpec(job.mixer, task, job.preset, task.Config.model_validate(job.config), torch.device(job.device_type), job.seed)
    record, path = execute(spec, Path(results or job.results), Tracker(enabled=wandb), progress)
    outcome = Outcome(job.key, record.status, str(path), record.error, record.duration_s, where)
    if record.status != "ok" and job.device_type == "cuda":
        release_gpu_after_failure(job, outcome)
    return outcome


class GpuContextLost(ExecutorError):
    """A run's CUDA error left this process's GPU unusable; `outcome` is that run's (failed,
    recorded)."""

    def __init__(self, message: str, outcome: Outcome):
        super().__init__(message)
        self.outcome = outcome


def release_gpu_after_failure(job: Job, outcome: Outcome) -> None:
    """After a failed run: give the next run the GPU memory back (an OOM). A sticky CUDA
    error (an illegal address, a device-side assert) leaves this process's CUDA context
    unusable, so no later run could start in it: GpuContextLost says so and how to go on."""
    import torch

    from tasks.common.faults import describe

    try:
        torch.cuda.empty_cache()
    except torch.AcceleratorError as e:
        raise GpuContextLost(
            f"{job.mixer} · {job.task}/{job.preset} hit a CUDA error that leaves this process's GPU unusable "
            f"({describe(e, 120)}); its failed record is {outcome.record}. The runs not yet started were not: run "
            "the same command again to go on in a fresh process (finished runs count as done)", outcome
        ) from e


def write_crash_record(job: Job, error: str, device: str, since: float) -> Outcome:
    """A failed record for a run whose process died before it could write one; `since`:
    time.time() when the run was handed out."""
    import datetime as dt

    from harness.envinfo import process_commit, versions
    from harness.records import RunRecord, write_record
    from harness.runner import RunSpec, new_run_id
    from tasks import get_task

    task = get_task(job.task)
    def stamp(t: float) -> str:
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")

    now = time.time()
    spec = RunSpec(job.mixer, task, job.preset, task.Config.model_validate(job.config), None, job.seed)  # type: ignore[arg-type]
    record = RunRecord(
        run_id=new_run_id(spec, job.config_hash), config_hash=job.config_hash, mixer=job.mixer, task=job.task,
        preset=job.preset, config=job.config, backend=None, device=device, versions=versions(), git_commit=process_commit(),
        seed=job.seed, started=stamp(since), finished=stamp(now), duration_s=now - since, status="failed", error=error,
    )
    path = write_record(Path(job.results), record)
    return Outcome(job.key, "failed", str(path), error, now - since, device)


class InProcessExecutor:
    """Runs one job at a time in this process; `progress` shows the task's own bars."""

    name = "inprocess"
    slots = 1

    def __init__(self, device_type: str, wandb: bool = True, progress: Any = None):
        self.device_type, self.wandb, self.progress = device_type, wandb, progress
        self.where = f"this process ({device_type})"
        self._queue: list[Job] = []

    def submit(self, job: Job) -> None:
        self._queue.append(job)

    def poll(self, timeout: float) -> list[Outcome]:
        done = []
        while self._queue:
            done.append(run_job(self._queue.pop(0), wandb=self.wandb, progress=self.progress, where="this process"))
        return done

    def abort(self) -> None:
        self._queue.clear()

    def close(self) -> None:
        pass


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the sweep that started it dies (even by SIGKILL)."""
    import ctypes

    parent = int(os.environ.get("HARNESS_SWEEP_PARENT", "0"))
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent and os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


def worker_main() -> None:
    """A worker process: jobs in as JSON lines on stdin, outcomes out as JSON lines.

    SIGUSR1 prints every thread's Python stack to the worker's log (faulthandler), so a run
    that stalls can say where without being stopped."""
    import faulthandler

    _die_with_parent()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the task prints goes to the log, not into the protocol
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    import torch

    from harness.envinfo import device_name

    device_type = os.environ.get("HARNESS_WORKER_DEVICE", "cpu")
    if device_type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"worker: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} but torch sees no CUDA device")
    out.write(json.dumps({"hello": device_name(torch.device(device_type))}) + "\n")
    wandb = os.environ.get("HARNESS_WORKER_WANDB") == "1"
    label = os.environ.get("HARNESS_WORKER_LABEL", "worker")
    for line in sys.stdin:
        job = Job(**json.loads(line))
        try:
            outcome = run_job(job, wandb=wandb, where=label)
        except GpuContextLost as e:  # report the run, then end: the pool starts a fresh worker for the next
            out.write(json.dumps({"outcome": asdict(e.outcome)}) + "\n")
            print(f"worker {label}: {e}", file=sys.stderr)
            return
        out.write(json.dumps({"outcome": asdict(outcome)}) + "\n")


class _Worker:
    def __init__(self, label: str, env: dict[str, str]):
        self.label, self.env = label, env
        self.proc: subprocess.Popen | None = None
        self.job: Job | None = None
        self.since = 0.0  # when the job was handed to it
        self.device: str | None = None  # from the worker's hello
        self.buffer = b""


class WorkerPoolExecutor:
    """One worker process per slot; `slot_envs[i]` is added to worker i's environment."""

    name = "workers"

    def __init__(self, slot_envs: list[dict[str, str]], labels: list[str], device_type: str, log_dir: Path,
                 wandb: bool = True, argv: list[str] | None = None):
        self.device_type, self.wandb, self.log_dir = device_type, wandb, Path(log_dir)
        self.argv = argv or [sys.executable, "-m", "harness.executors"]
        self.workers = [_Worker(label, env) for label, env in zip(labels, slot_envs)]
        self.slots = len(self.workers)
        self.where = f"{self.slots} worker process(es): {', '.join(labels)}"
        self.selector = selectors.DefaultSelector()

    def _start(self, w: _Worker) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **w.env, "HARNESS_SWEEP_PARENT": str(os.getpid()), "HARNESS_WORKER_LABEL": w.label,
               "HARNESS_WORKER_DEVICE": self.device_type, "HARNESS_WORKER_WANDB": "1" if self.wandb else "0",
               "PYTHONUNBUFFERED": "1"}
        with open(self.log_dir / f"{w.label}.log", "ab") as log:
            # A session of its own: Ctrl-C reaches only the sweep, which then stops the workers.
            w.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                                      bufsize=0, start_new_session=True)
        w.device, w.buffer = None, b""
        os.set_blocking(w.proc.stdout.fileno(), False)
        self.selector.register(w.proc.stdout, selectors.EVENT_READ, w)

    def submit(self, job: Job) -> None:
        w = next(w for w in self.workers if w.job is None)
        if w.proc is None or w.proc.poll() is not None:
            self._start(w)
        w.job, w.since = job, time.time()
        w.proc.stdin.write((json.dumps(asdict(job)) + "\n").encode())
        w.proc.stdin.flush()

    def poll(self, timeout: float) -> list[Outcome]:
        done = []
        for sel_key, _ in self.selector.select(timeout):
            w: _Worker = sel_key.data
            try:
                chunk = os.read(w.proc.stdout.fileno(), 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                done += self._died(w)
                continue
            w.buffer += chunk
            while b"\n" in w.buffer:
                line, w.buffer = w.buffer.split(b"\n", 1)
                msg = json.loads(line)
                if "hello" in msg:
                    w.device = msg["hello"]
                else:
                    w.job = None
                    done.append(Outcome(**msg["outcome"]))
        return done

    def _died(self, w: _Worker) -> list[Outcome]:
        self.selector.unregister(w.proc.stdout)
        rc = w.proc.wait()
        job, w.job, w.proc = w.job, None, None
        how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        tail = _tail(self.log_dir / f"{w.label}.log")
        if w.device is None:  # never came up: the harness cannot start there, not a run failure
            raise ExecutorError(f"worker {w.label} died on start-up ({how}); its log ends:\n{tail}")
        if job is None:
            return []
        error = f"WorkerDied: the worker process on {w.label} stopped with {how} during this run; its log ends:\n{tail}"
        return [write_crash_record(job, error, w.device, w.since)]

    def abort(self) -> None:
        """Stop every worker now: SIGKILL to its whole process group (a worker runs in a session
        of its own, and its runs' children, such as Inductor's compile workers, with it). A
        worker that has not exited 10 s later (stuck in a driver call) is named on stderr and
        left behind rather than hanging the sweep."""
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                try:
                    os.killpg(w.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    w.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    print(f"harness: worker {w.label} (pid {w.proc.pid}) did not exit 10 s after SIGKILL; "
                          "left behind", file=sys.stderr)
            w.proc, w.job = None, None
        self.selector = selectors.DefaultSelector()

    def close(self) -> None:
        for w in self.workers:
            if w.proc is not None:
                w.proc.stdin.close()  # EOF: the worker finishes its loop and exits
                try:
                    w.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    w.proc.kill()
        self.abort()


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def check_runs_per_gpu(kind: str, runs_per_gpu: int) -> None:
    """Raise ExecutorError unless `runs_per_gpu` is an integer >= 1, and 1 for executors other
    than 'gpus' (the only one that starts several workers per GPU)."""
    if isinstance(runs_per_gpu, bool) or not isinstance(runs_per_gpu, int) or runs_per_gpu < 1:
        raise ExecutorError(f"--runs-per-gpu must be an integer of at least 1 (the worker processes per GPU of "
                            f"--executor gpus), got {runs_per_gpu!r}")
    if kind != "gpus" and runs_per_gpu != 1:
        raise ExecutorError(f"--runs-per-gpu {runs_per_gpu} works only with --executor gpus, not --executor {kind}; "
                            f"valid values: any N >= 1 with --executor gpus, 1 (the default) with inprocess or ray")


def gpu_slot_envs(ids: list[str], runs_per_gpu: int, cpu_count: int | None,
                  environ: dict[str, str] | None = None) -> tuple[list[dict[str, str]], list[str]]:
    """The worker environments (what each adds to the sweep's own) and labels for
    `runs_per_gpu` workers on each GPU of `ids` (CUDA_VISIBLE_DEVICES entries).

    Labels are `gpu<id>` with one worker per GPU and `gpu<id>.<k>` (k = 1..N) with N.
    OMP_NUM_THREADS is max(1, cpu_count // workers) unless `environ` (default os.environ)
    has it already. No per-worker TRITON_CACHE_DIR: workers inherit the sweep's (or Triton's
    default, shared by one user's processes), so a kernel one worker compiles the others reuse."""
    check_runs_per_gpu("gpus", runs_per_gpu)
    environ = os.environ if environ is None else environ
    total = len(ids) * runs_per_gpu
    threads = {} if "OMP_NUM_THREADS" in environ else {"OMP_NUM_THREADS": str(max(1, (cpu_count or 1) // max(1, total)))}
    envs, labels = [], []
    for i in ids:
        for k in range(1, runs_per_gpu + 1):
            envs.append({"CUDA_VISIBLE_DEVICES": i, **threads})
            labels.append(f"gpu{i}" if runs_per_gpu == 1 else f"gpu{i}.{k}")
    return envs, labels


def _no_gpu_message() -> str:
    import torch

    build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
    return (f"--executor gpus runs one worker per local GPU, but this machine has no CUDA GPU that torch can see "
            f"(torch {torch.__version__}, {build}). Use --executor inprocess on a CPU, or --executor ray for a cluster.")


def check_executor(kind: str, device: str, runs_per_gpu: int = 1, address: str | None = None,
                   runs_here: bool = True) -> None:
    """ExecutorError, before a sweep touches its results folder, for executor options that cannot
    work: an unknown kind, --runs-per-gpu or --address with an executor that takes none, and, when
    the sweep `runs_here` (not a dry run, which may plan a GPU sweep on a laptop), no GPU for
    'gpus' or Ray not installed for 'ray'. (A Ray cluster's resources are known only once joined:
    make_executor checks those.)"""
    if kind not in ("inprocess", "gpus", "ray"):
        raise ExecutorError(f"--executor {kind!r} is not valid; expected inprocess, gpus or ray")
    check_runs_per_gpu(kind, runs_per_gpu)
    if address is not None and kind != "ray":
        raise ExecutorError(f"--address {address} works only with --executor ray, not --executor {kind}; "
                            "add --executor ray or leave --address out")
    if not runs_here:
        return
    if kind == "gpus":
        import torch

        if torch.cuda.device_count() == 0:
            raise ExecutorError(_no_gpu_message())
        if device == "cpu":
            raise ExecutorError("--executor gpus runs on GPUs, but the sweep asks for device cpu; use --executor inprocess")
    if kind == "ray" and importlib.util.find_spec("ray") is None:
        raise ExecutorError("--executor ray needs Ray, which is not installed: pip install -e '.[ray]'")


def local_gpu_executor(log_dir: Path, wandb: bool = True, runs_per_gpu: int = 1) -> WorkerPoolExecutor:
    """`runs_per_gpu` workers per local GPU (those CUDA_VISIBLE_DEVICES lets this process see)."""
    check_runs_per_gpu("gpus", runs_per_gpu)
    import torch

    count = torch.cuda.device_count()  # counts devices without creating a CUDA context
    if count == 0:
        raise ExecutorError(_no_gpu_message())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in visible.split(",")][:count] if visible else [str(i) for i in range(count)]
    envs, labels = gpu_slot_envs(ids, runs_per_gpu, os.cpu_count())
    pool = WorkerPoolExecutor(envs, labels, "cuda", log_dir, wandb)
    if runs_per_gpu > 1:
        pool.where = f"{pool.slots} worker processes, {runs_per_gpu} per GPU: {', '.join(labels)}"
    return pool


class RayExecutor:
    """Runs on a Ray cluster (`address`, or a local one started here): one GPU per run when
    the cluster has GPUs (device auto or cuda), one CPU per run otherwise."""

    name = "ray"

    def __init__(self, device: str, address: str | None = None, wandb: bool = True, init_kwargs: dict | None = None):
        try:
            import ray
        except ImportError:
            raise ExecutorError("--executor ray needs Ray, which is not installed: pip install -e '.[ray]'") from None
        self.ray, self.wandb = ray, wandb
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report leaves the machine
        ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init_kwargs or {}))
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 1))
        if device == "cuda" and gpus == 0:
            ray.shutdown()
            raise ExecutorError(f"the sweep asks for device cuda, but the Ray cluster ({address or 'local'}) has no GPU")
        self.device_type = "cuda" if device in ("auto", "cuda") and gpus > 0 else "cpu"
        self.slots = gpus if self.device_type == "cuda" else max(1, cpus)
        self.where = f"ray {address or 'local'} ({gpus} GPU, {cpus} CPU)"
        self.remote = ray.remote(_ray_run).options(
            num_gpus=1 if self.device_type == "cuda" else 0, num_cpus=1, max_retries=0)
        self.pending: dict[Any, tuple[Job, float]] = {}

    def submit(self, job: Job) -> None:
        self.pending[self.remote.remote(asdict(job), self.wandb)] = (job, time.time())

    def poll(self, timeout: float) -> list[Outcome]:
        if not self.pending:
            return []
        ready, _ = self.ray.wait(list(self.pending), num_returns=len(self.pending), timeout=timeout)
        done = []
        for ref in ready:
            job, since = self.pending.pop(ref)
            try:
                reply = self.ray.get(ref)
            except self.ray.exceptions.RayError as e:  # the worker died (OOM killer, node lost)
                device = "cpu: ray worker" if job.device_type == "cpu" else "ray worker GPU"
                done.append(write_crash_record(job, f"{type(e).__name__}: {e}", device, since))
                continue
            done.append(_store_reply(job, reply))
        return done

    def abort(self) -> None:
        for ref in self.pending:
            self.ray.cancel(ref, force=True)
        self.pending.clear()

    def close(self) -> None:
        self.abort()
        self.ray.shutdown()


def _ray_run(job: dict, wandb: bool) -> dict:
    """On a Ray worker: run into a scratch folder and send the record and artifacts back."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as scratch:
        outcome = run_job(Job(**job), results=Path(scratch), wandb=wandb, where=f"ray:{socket.gethostname()}")
        record = Path(outcome.record)
        folder = record.with_suffix("")
        files = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else {}
        return {"outcome": asdict(outcome), "record": record.read_text(), "files": files}


def _store_reply(job: Job, reply: dict) -> Outcome:
    """Write a Ray run's artifacts, then its record (atomically, last) under job.results."""
    from harness.records import RunRecord, artifact_dir, write_record

    record = RunRecord.model_validate_json(reply["record"])
    folder = artifact_dir(Path(job.results), record.task, record.run_id)
    for name, data in reply["files"].items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    path = write_record(Path(job.results), record)
    return Outcome(**{**reply["outcome"], "record": str(path)})


def make_executor(kind: str, device: str, results: Path, wandb: bool = True, address: str | None = None,
                  progress: Any = None, runs_per_gpu: int = 1) -> Executor:
    """The executor named `kind` ('inprocess', 'gpus' or 'ray') for a sweep asking for `device`;
    `runs_per_gpu` worker processes per GPU with 'gpus' (it must be 1 with the others)."""
    if kind in ("inprocess", "gpus", "ray"):
        check_runs_per_gpu(kind, runs_per_gpu)
    if kind == "inprocess":
        from harness.runner import resolve_device

        return InProcessExecutor(resolve_device(device).type, wandb, progress)
    if kind == "gpus":
        pool = local_gpu_executor(Path(results) / ".sweep" / "logs", wandb, runs_per_gpu)
        if device == "cpu":
            raise ExecutorError("--executor gpus runs on GPUs, but the sweep asks for device cpu; use --executor inprocess")
        return pool
    if kind == "ray":
        return RayExecutor(device, address, wandb)
    raise ExecutorError(f"--executor {kind!r} is not valid; expected inprocess, gpus or ray")


if __name__ == "__main__":
    worker_main()
