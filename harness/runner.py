"""Run one (mixer, task) and write its record: the one place where tasks meet records."""

from __future__ import annotations

import datetime as dt
import secrets
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel

from harness.config import config_hash
from harness.envinfo import device_name, process_commit, versions
from harness.records import RunRecord, artifact_dir, write_record
from harness.tracking import Tracker, table_rows
from kernels.common.launch import recording_launches
from tasks.base import NullProgress, Progress, RunContext, RunDiverged, RunOutOfMemory, Task, learned_metrics
from tasks.common.checkpoint import CHECKPOINT_FILE
from tasks.common.resume import clear_state


class DeviceError(ValueError):
    """A device that is not present or not understood."""


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without CUDA is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {name}: no CUDA device is present here (torch {torch.__version__}); use cpu or auto")
        return torch.device(name)
    raise DeviceError(f"--device {name!r} is not valid; expected auto, cpu or cuda")


@dataclass
class RunSpec:
    """A fully resolved run: what to run, where and with which config."""

    mixer: str
    task: type[Task]
    preset: str
    config: BaseModel
    device: torch.device
    seed: int


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id(spec: RunSpec, chash: str) -> str:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{spec.task.name}-{spec.mixer}-{chash[:8]}-{secrets.token_hex(2)}"


def resume_dir(results: Path, task: str, chash: str, device_type: str) -> Path:
    """Where a run keeps its training state until its record is written: one folder per run key."""
    return Path(results) / ".resume" / task / f"{chash}-{device_type}"


def execute(spec: RunSpec, results: Path, tracker: Tracker, progress: Progress | None = None) -> tuple[RunRecord, Path]:
    """Run the task and write one record: ok, diverged (training became non-finite), oom (out of
    memory) or failed.
    KeyboardInterrupt writes nothing."""
    config = spec.config.model_dump(mode="json")
    chash = config_hash(spec.mixer, spec.task.name, config, spec.seed)
    run_id = new_run_id(spec, chash)
    adir = artifact_dir(results, spec.task.name, run_id)
    torch.manual_seed(spec.seed)
    resume = resume_dir(results, spec.task.name, chash, spec.device.type)
    ctx = RunContext(
        mixer=spec.mixer, config=spec.config, device=spec.device, seed=spec.seed, artifact_dir=adir,
        resume_dir=resume, progress=progress or NullProgress(), log=tracker.log, log_every=tracker.log_every,
    )
    # the source this process runs (a tree edited or committed meanwhile must not relabel it)
    commit, started, t0 = process_commit(), _now(), time.perf_counter()
    tracking = tracker.start(
        name=f"{spec.mixer}·{spec.task.name}·s{spec.seed}·{chash[:8]}", group=f"{spec.task.name}/{spec.preset}",
        config={"mixer": spec.mixer, "task": spec.task.name, "preset": spec.preset, "seed": spec.seed,
                "device": device_name(spec.device), "versions": versions(), "git_commit": commit,
                "record": f"runs/{spec.task.name}/{run_id}.json", **config},
        tags=[spec.task.name, spec.mixer, spec.device.type], job_type=spec.task.name,
    )
    metrics, details, artifacts, backend, error = {}, {}, [], None, None
    launches: dict = {}
    try:
        with recording_launches() as launches:  # the launch settings of every Triton op the run uses
            result = spec.task().run(ctx)
        metrics, details, artifacts, backend = result.metrics, result.details, result.artifacts, result.backend
        status = "ok"
        metrics = {**metrics, **learned_metrics(spec.task, spec.config, metrics)}
    except KeyboardInterrupt:
        tracker.finish({}, failed=True)
        raise
    except RunDiverged as e:
        status, error = "diverged", f"{type(e).__name__}: {e}"
    except (RunOutOfMemory, torch.cuda.OutOfMemoryError, MemoryError) as e:
        status, error = "oom", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - any failure of a run becomes a failed record
        status = "failed"
        tail = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:])
        error = f"{type(e).__name__}: {e}\n{tail}"
    record = RunRecord(
        run_id=run_id, config_hash=chash, mixer=spec.mixer, task=spec.task.name, preset=spec.preset,
        config=config, metrics={k: float(v) for k, v in metrics.items()}, details=details,
        artifacts=[f"{run_id}/{a}" for a in artifacts], backend=backend, device=device_name(spec.device),
        versions=versions(), git_commit=commit, seed=spec.seed, started=started, finished=_now(),
        duration_s=time.perf_counter() - t0, status=status, error=error, wandb=tracking,
        launch=launches or None,
    )
    path = write_record(results, record)
    if status in ("ok", "diverged"):  # done for good; a failed or oom run may resume on a retry
        clear_state(resume)
    tracker.log_outputs(
        images=[adir / a for a in artifacts if a.endswith(".png") and (adir / a).is_file()],
        tables={k: rows for k, v in details.items() if (rows := table_rows(v)) is not None})
    tracker.log_record(path, run_id, adir / CHECKPOINT_FILE if CHECKPOINT_FILE in artifacts else None)
    tracker.finish({**record.metrics, "status": status, "backend": backend or ""}, failed=status != "ok")
    return record, path
