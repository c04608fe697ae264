"""Run records (docs/design.md §6): one self-contained JSON file per run, written atomically.

Layout: <results>/runs/<task>/<run_id>.json, with any artifacts (plots) of the run in
<results>/runs/<task>/<run_id>/. A record is written to a temporary file in the same
folder, flushed to disk and renamed into place, so a reader never sees half a record and
concurrent runs never clobber each other (run ids are unique)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = "harness.run/1"
# The largest seed a run takes: every random generator of a run takes 0..2**32 - 1 (numpy's legacy
# seeding, which lm-eval uses, stops there).
SEED_MAX = 2**32 - 1


class RunRecord(BaseModel):
    """The run record. `metrics` are flat name -> number; `details` holds structured results."""

    model_config = ConfigDict(extra="forbid")

    schema_: str = Field(SCHEMA, alias="schema")
    run_id: str
    config_hash: str
    mixer: str
    task: str
    preset: str
    config: dict[str, Any]
    metrics: dict[str, float] = Field(default_factory=dict)
    details: dict[str, Any] = Field(default_factory=dict)
    artifacts: list[str] = Field(default_factory=list)
    backend: str | None
    device: str
    versions: dict[str, str | None]
    git_commit: str | None
    seed: int
    started: str
    finished: str
    duration_s: float
    status: Literal["ok", "failed", "diverged", "oom"]  # diverged: training became non-finite; oom: out of memory
    error: str | None = None
    wandb: dict[str, str] | None = None  # the wandb run: id, path (entity/project/id), local folder
    # op -> the launch settings (kernels/common/launch/, as nested dicts) its Triton kernels
    # ran with in this run; None for a run that ran no Triton kernel
    launch: dict[str, dict[str, Any]] | None = None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(by_alias=True), indent=1, sort_keys=False, default=_jsonable)


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def device_type_of(device: str) -> str:
    """'cpu' or 'cuda' from a record's device name ('cpu: <model>' or the GPU's name)."""
    return "cpu" if device.startswith("cpu") else "cuda"


class UnreadableRecordWarning(UserWarning):
    """A file under runs/ that is not a valid run record (torn, hand-edited, another schema)."""

    def __init__(self, message: str, path: Path | None = None):
        super().__init__(message)
        self.path = path


def warn_unreadable(path: Path, error: Exception) -> None:
    """Say that `path` was skipped because it is not a readable run record, and why."""
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    warnings.warn(UnreadableRecordWarning(f"skipped {path}: not a readable run record ({reason})", path), stacklevel=3)


@contextlib.contextmanager
def reporting_unreadable(say: Callable[[str], None]) -> Iterator[None]:
    """Within the block, `say` each unreadable record file once, as it is met, whatever Python's
    warning filters are (a command must not skip a file without a word); at the end, if any were,
    a line with how many. Other warnings pass on as before."""
    said: set[str] = set()
    show = warnings.showwarning

    def report(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, UnreadableRecordWarning):
            show(message, category, filename, lineno, file, line)
            return
        key = str(getattr(message, "path", None) or message)
        if key not in said:
            said.add(key)
            say(str(message))

    with warnings.catch_warnings():
        warnings.simplefilter("always", UnreadableRecordWarning)
        warnings.showwarning = report
        try:
            yield
        finally:
            if said:
                say(f"{len(said)} unreadable record file(s) skipped")


def runs_dir(results: Path) -> Path:
    return Path(results) / "runs"


def record_path(results: Path, task: str, run_id: str) -> Path:
    return runs_dir(results) / task / f"{run_id}.json"


def artifact_dir(results: Path, task: str, run_id: str) -> Path:
    return runs_dir(results) / task / run_id


def write_record(results: Path, record: RunRecord) -> Path:
    """Write `record` atomically; returns its path."""
    path = record_path(results, record.task, record.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{record.run_id}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(record.to_json())
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes owner-only files; records are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


ORPHAN_AGE_S = 60.0  # a record's temp file lives milliseconds; one this old lost its writer


def prepare_results(results: Path) -> int:
    """Make sure `results` can take records before anything runs, and delete the temp files of
    record writes that were killed mid-write. Returns how many were deleted.

    Raises ValueError naming the path when it is a file or cannot be created."""
    results = Path(results)
    if results.exists() and not results.is_dir():
        raise ValueError(f"--results {results} is a file; give a directory (records go to <results>/runs)")
    try:
        runs_dir(results).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--results {results}: cannot create {runs_dir(results)} ({e.strerror})") from None
    if not os.access(runs_dir(results), os.W_OK):
        raise ValueError(f"--results {results}: {runs_dir(results)} is not writable")
    removed = 0
    now = time.time()
    for tmp in runs_dir(results).glob("*/.*.tmp"):
        try:
            if now - tmp.stat().st_mtime > ORPHAN_AGE_S:
                tmp.unlink()
                removed += 1
        except OSError:
            continue  # another process renamed or removed it meanwhile
    return removed


def load_records(results: Path) -> Iterator[tuple[Path, RunRecord]]:
    """Every valid record under <results>/runs, with its path. An unreadable file is skipped
    with an UnreadableRecordWarning naming it and why (commands print it to stderr)."""
    root = runs_dir(results)
    if not root.exists():
        return
    for path in sorted(root.glob("*/*.json")):
        try:
            record = RunRecord.model_validate_json(path.read_text())
        except (ValueError, OSError) as e:
            warn_unreadable(path, e)
            continue
        yield path, record


K = TypeVar("K")


def newest_ok(results: Path, key: Callable[[RunRecord], K], keep: Callable[[RunRecord], bool]) -> dict[K, RunRecord]:
    """key(record) -> the newest (by `finished`) ok record under <results>/runs with that key,
    among those keep(record) accepts."""
    newest: dict[K, RunRecord] = {}
    for _, rec in load_records(results):
        if rec.status != "ok" or not keep(rec):
            continue
        k = key(rec)
        if k not in newest or rec.finished > newest[k].finished:
            newest[k] = rec
    return newest
