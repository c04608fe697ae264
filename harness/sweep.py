"""Sweeps: a YAML grid expanded into fully resolved runs, each with a stable run key.

A sweep file names blocks of runs; each block is the product
tasks x presets x `vary` values x mixers x seeds, with fixed `set` overrides:

    device: cuda                          # auto (default), cpu or cuda
    mixers: [softmax, gdn]                # defaults for every block (a block may override)
    seeds: [0]
    set: {optim.epochs: 2}                # fixed overrides for every block
    grid:
      - tasks: [mqar]
        presets: [tiny]
        vary: {optim.lr: [1e-3, 3e-3]}    # one run per value (several keys: their product)

The run key is the config hash of the record (harness.config.config_hash of mixer, task,
resolved config and seed, as `harness run` writes it) plus the device type, so a record
written by `harness run` with the same settings counts as done. Resume: a key that already
has an ok record is skipped, and so is one that diverged (an outcome of its settings, which a
rerun repeats); a failed one is skipped unless retrying. A claim (an flock on
<results>/.sweep/locks/<key>.lock, held while the run is in flight) keeps two sweeps on one
results directory from running the same key; the kernel drops it when its holder dies, so a
killed sweep leaves no claim held. `run_sweep` is the driver.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import math
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.config import (
    ConfigError,
    check_mixer_run,
    check_task_config,
    config_hash,
    load_yaml,
    resolve_config,
)
from harness.executors import Executor, Job, Outcome
from harness.records import SEED_MAX, device_type_of, runs_dir, warn_unreadable


class SweepError(ValueError):
    """A sweep file that cannot be expanded; the message lists every problem found."""


def _as_list(value: Any) -> Any:
    return [value] if value is not None and not isinstance(value, list) else value


# Lists of the grid: an empty one would expand to no runs at all, so it is refused by name.
Names = Annotated[list[str], Field(min_length=1)]
Seeds = Annotated[list[Annotated[int, Field(ge=0, le=SEED_MAX)]], Field(min_length=1)]
Values = Annotated[list[Any], Field(min_length=1)]


class GridBlock(BaseModel):
    """One block of the grid; unset lists fall back to the file's top-level defaults."""

    model_config = ConfigDict(extra="forbid")

    tasks: Names
    mixers: list[str] | None = None  # an empty list is named by `expand` ("no mixers")
    presets: Names | None = None
    seeds: Seeds | None = None
    set: dict[str, Any] = Field(default_factory=dict)
    vary: dict[str, Values] = Field(default_factory=dict)

    @field_validator("tasks", "mixers", "presets", "seeds", mode="before")
    @classmethod
    def _scalar_to_list(cls, v: Any) -> Any:
        return _as_list(v)


class SweepFile(BaseModel):
    """A whole sweep file."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    description: str | None = None
    device: str = "auto"
    mixers: list[str] = Field(default_factory=list)
    presets: Names = Field(default_factory=lambda: ["default"])
    seeds: Seeds = Field(default_factory=lambda: [0])
    set: dict[str, Any] = Field(default_factory=dict)
    grid: list[GridBlock] = Field(min_length=1)

    @field_validator("mixers", "presets", "seeds", mode="before")
    @classmethod
    def _scalar_to_list(cls, v: Any) -> Any:
        return _as_list(v)


def load_sweep(path: Path) -> SweepFile:
    """Read and check the shape of a sweep file (names are checked by `expand`)."""
    try:
        data = load_yaml(Path(path).read_text())
    except OSError as e:
        raise SweepError(f"cannot read sweep file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise SweepError(f"sweep file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SweepError(f"sweep file {path} must hold a mapping with a 'grid' list, got {type(data).__name__}")
    try:
        return SweepFile(**data)
    except ValidationError as e:
        lines = [f"{'.'.join(str(p) for p in err['loc']) or '(file)'}: {err['msg']}"
                 + (f" (got {err['input']!r})" if err["type"] != "missing" else "") for err in e.errors()]
        valid = ", ".join(SweepFile.model_fields) + "; in a grid block: " + ", ".join(GridBlock.model_fields)
        raise SweepError(f"sweep file {path}: " + "; ".join(lines) + f" (valid keys: {valid})") from None


@dataclass(frozen=True)
class SweepPoint:
    """One fully resolved run of the grid."""

    mixer: str
    task: str
    preset: str
    seed: int
    overrides: tuple[tuple[str, Any], ...]  # the `set`/`vary` values that made it, in order
    config: dict[str, Any] = field(compare=False, hash=False)  # resolved, JSON form
    config_hash: str = ""
    device_type: str = "cpu"

    @property
    def key(self) -> str:
        """The run key: the record's config hash plus the device type ('cpu' or 'cuda')."""
        return f"{self.config_hash}-{self.device_type}"

    @property
    def label(self) -> str:
        extra = " ".join(f"{k}={json.dumps(v)}" for k, v in self.overrides)
        return f"{self.task}/{self.preset} · {self.mixer} · seed {self.seed}" + (f" · {extra}" if extra else "")


@dataclass
class Plan:
    """The expanded grid: unique points in run order, and how many duplicates were dropped."""

    name: str
    device: str  # as the file asks: auto, cpu or cuda
    points: list[SweepPoint]
    duplicates: int = 0


def set_item(key: str, value: Any) -> str:
    """One override as `--set` takes it: KEY=YAML text that safe_load reads back as `value`
    exactly (the same path as `harness run --set`)."""
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip()}"


def expand(
    sweep: SweepFile, device_type: str, only_tasks: list[str] | None = None, only_mixers: list[str] | None = None
) -> Plan:
    """Expand and validate the whole grid (every problem is collected, then one SweepError).

    device_type: 'cpu' or 'cuda', where the runs will happen (part of each run key)."""
    from mixers import UnknownMixerError, get_mixer
    from tasks import UnknownTaskError, get_task

    errors: list[str] = []
    points: list[SweepPoint] = []
    for bi, block in enumerate(sweep.grid):
        where = f"grid[{bi}]"
        mixers = block.mixers if block.mixers is not None else sweep.mixers
        presets = block.presets if block.presets is not None else sweep.presets
        seeds = block.seeds if block.seeds is not None else sweep.seeds
        if not mixers:
            errors.append(f"{where}: no mixers (give 'mixers' in the block or at the top of the file)")
        known = []
        for mixer in mixers:
            try:
                get_mixer(mixer)
                known.append(mixer)
            except UnknownMixerError as e:
                errors.append(f"{where if block.mixers is not None else 'mixers'}: {e}")
        mixers = [m for m in known if not only_mixers or m in only_mixers]
        for key in sorted(block.set.keys() & block.vary.keys()):
            errors.append(f"{where}: {key} is both in set ({block.set[key]!r}) and in vary ({block.vary[key]!r}); "
                          "give it in one of them")
        fixed = {**sweep.set, **block.set}
        axes = list(block.vary.items())
        for task_name in block.tasks:
            try:
                task = get_task(task_name)
            except UnknownTaskError as e:
                errors.append(f"{where}: {e}")
                continue
            if only_tasks and task_name not in only_tasks:
                continue
            for preset, combo in itertools.product(presets, itertools.product(*(vals for _, vals in axes))):
                overrides = tuple(fixed.items()) + tuple((k, v) for (k, _), v in zip(axes, combo))
                try:
                    cfg = resolve_config(task, preset, None, [set_item(k, v) for k, v in overrides])
                except ConfigError as e:
                    errors.append(f"{where} (task {task_name}, preset {preset}): {e}")
                    continue
                try:
                    check_task_config(task, cfg, device_type)
                except ConfigError as e:
                    errors.append(f"{where} (task {task_name}, preset {preset}): {e}")
                    continue
                config = cfg.model_dump(mode="json")
                for mixer in mixers:
                    try:
                        check_mixer_run(task, mixer, cfg, device_type)
                    except ConfigError as e:
                        errors.append(f"{where} (task {task_name}, preset {preset}, mixer {mixer}): {e}")
                        continue
                    for seed in seeds:
                        chash = config_hash(mixer, task_name, config, seed)
                        points.append(SweepPoint(mixer, task_name, preset, seed, overrides, config, chash, device_type))
    for name in only_tasks or []:
        if not any(name in b.tasks for b in sweep.grid):
            tasks = ", ".join(sorted({t for b in sweep.grid for t in b.tasks}))
            errors.append(f"--task {name}: not a task of this sweep (its tasks: {tasks})")
    sweep_mixers = sorted({m for b in sweep.grid for m in (b.mixers if b.mixers is not None else sweep.mixers)})
    for name in only_mixers or []:
        if name not in sweep_mixers:
            errors.append(f"--mixer {name}: not a mixer of this sweep (its mixers: {', '.join(sweep_mixers)})")
    if errors:
        unique = list(dict.fromkeys(errors))
        raise SweepError(f"{len(unique)} problem(s) in the sweep, nothing was run:\n  " + "\n  ".join(unique))
    unique: dict[str, SweepPoint] = {}
    for point in points:  # the first of points that resolve alike (dicts keep insertion order)
        unique.setdefault(point.key, point)
    return Plan(sweep.name or "sweep", sweep.device, list(unique.values()), len(points) - len(unique))


def _same_value(have: Any, wanted_text: str) -> bool:
    """Whether a point's `set`/`vary` value equals the text of a --where condition: numbers as
    numbers (0.01 matches 1.0e-2), anything else as the YAML the text reads as."""
    if isinstance(have, (int, float)) and not isinstance(have, bool):
        try:
            return math.isclose(float(have), float(wanted_text), rel_tol=1e-9, abs_tol=0.0)
        except ValueError:
            return False
    return have == yaml.safe_load(wanted_text)


def select_where(plan: Plan, conditions: list[str]) -> Plan:
    """The points of `plan` whose `set`/`vary` value of each KEY equals VALUE, for conditions
    "KEY=VALUE" (e.g. model.d_model=256) or "KEY=V1,V2" (any of the values); their run keys
    are those of the whole grid, so a selection resumes and fills the same sweep. SweepError
    naming the keys and values the sweep has when a condition is malformed, names no key of
    the sweep or selects nothing."""
    values: dict[str, list[Any]] = {}
    for point in plan.points:
        for key, value in point.overrides:
            if value not in values.setdefault(key, []):
                values[key].append(value)

    def listed(key: str) -> str:
        return ", ".join(json.dumps(v) for v in values[key])

    known = "; ".join(f"{k}: {listed(k)}" for k in values) or "none"
    parsed = []
    for text in conditions:
        key, sep, wanted = text.partition("=")
        key, wanted = key.strip(), wanted.strip()
        if not sep or not key or not wanted:
            raise SweepError(f"--where {text!r}: give KEY=VALUE, a `set` or `vary` key of the sweep and one of its "
                             f"values (this sweep has {known})")
        if key not in values:
            raise SweepError(f"--where {text!r}: {key} is not a `set` or `vary` key of this sweep (it has {known})")
        alternatives = [w.strip() for w in wanted.split(",")]
        if not all(alternatives):
            raise SweepError(f"--where {text!r}: an empty value in the list (give KEY=V1,V2 with values of {key}: "
                             f"{listed(key)})")
        parsed.append((key, alternatives))
    kept = [p for p in plan.points
            if all(any(k == key and any(_same_value(v, w) for w in wanted) for k, v in p.overrides)
                   for key, wanted in parsed)]
    if not kept:
        raise SweepError(f"--where {' '.join(conditions)}: no run of the sweep matches (it has {known})")
    return Plan(plan.name, plan.device, kept, plan.duplicates)


def select_keys(plan: Plan, prefixes: list[str]) -> Plan:
    """The points of `plan` whose run key starts with one of `prefixes` (at least 6 hex digits
    each, as `--dry-run` prints them), in the order given, so the first ones start first.
    SweepError when a prefix is too short, matches no run or more than one."""
    chosen = []
    for prefix in prefixes:
        prefix = prefix.strip().lower()
        if len(prefix) < 6 or any(c not in "0123456789abcdef" for c in prefix):
            raise SweepError(f"--key {prefix!r}: give at least 6 hex digits of a run key (as --dry-run prints them)")
        matches = [p for p in plan.points if p.key.startswith(prefix)]
        if not matches:
            raise SweepError(f"--key {prefix}: no run of this selection has a key starting so ({len(plan.points)} "
                             "run(s); see --dry-run)")
        if len(matches) > 1:
            raise SweepError(f"--key {prefix}: {len(matches)} runs have keys starting so; give more digits")
        if matches[0] not in chosen:
            chosen.append(matches[0])
    return Plan(plan.name, plan.device, chosen, plan.duplicates)


# -- records of a key ------------------------------------------------------------------


@dataclass(frozen=True)
class KeyRecords:
    """The records already written for one run key: paths of finished ones (ok or diverged)
    and of failed ones."""

    ok: tuple[Path, ...] = ()
    failed: tuple[Path, ...] = ()

    @property
    def state(self) -> str:
        return "done" if self.ok else "failed" if self.failed else "pending"

    @property
    def paths(self) -> frozenset[Path]:
        return frozenset(self.ok + self.failed)


def key_records(results: Path, point: SweepPoint) -> KeyRecords:
    """Records under `results` whose config hash (as today's config classes resolve the record's
    config) and device type are the point's. A record written before a config field existed
    counts as that field's default: adding an option with a default does not orphan old runs."""
    ok, failed = [], []
    for path in sorted((runs_dir(results) / point.task).glob("*.json")):
        found = _record_key(path)
        if found is None or found[0] != point.config_hash or found[1] != point.device_type:
            continue
        (ok if found[2] in ("ok", "diverged") else failed).append(path)
    return KeyRecords(tuple(ok), tuple(failed))


_record_keys: dict[Path, tuple[int, tuple[str, str, str] | None]] = {}


def _record_key(path: Path) -> tuple[str, str, str] | None:
    """(config hash under today's config classes, device type, status) of a record, cached by
    modification time; None for a file that is no record or whose config no longer resolves."""
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return None
    cached = _record_keys.get(path)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    key = None
    # An unreadable record counts as none, so its run may run again: said, not skipped in silence.
    try:
        data = json.loads(path.read_text())
        key = (_current_hash(data), device_type_of(str(data.get("device", ""))), str(data.get("status")))
    except KeyError as e:
        warn_unreadable(path, ValueError(f"no {e} field"))
    except (OSError, ValueError, TypeError, AttributeError) as e:
        warn_unreadable(path, e)
    _record_keys[path] = (mtime, key)
    return key


def _current_hash(data: dict[str, Any]) -> str:
    from tasks import UnknownTaskError, get_task

    try:
        task = get_task(data["task"])
        config = task.Config(**data["config"]).model_dump(mode="json")
    except (UnknownTaskError, ValidationError):
        return str(data.get("config_hash"))
    return config_hash(data["mixer"], data["task"], config, int(data["seed"]))


# -- claims: one process runs a key at a time ------------------------------------------


class Claim:
    """An exclusive flock on <results>/.sweep/locks/<key>.lock; `release` removes the file."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    def release(self) -> None:
        # Unlink while still holding the lock: a process that opened the old file sees a
        # different inode after locking it and tries again (see try_claim).
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self.fd)


def try_claim(results: Path, key: str) -> Claim | None:
    """Claim `key`, or None when another live process holds it. Never blocks."""
    lock_dir = Path(results) / ".sweep" / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_dir / f"{key}.lock"
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            os.ftruncate(fd, 0)
            os.write(fd, f"{socket.gethostname()} pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
            return Claim(path, fd)
        os.close(fd)  # the holder released and removed it between our open and lock


# -- the driver ------------------------------------------------------------------------


class SweepEvents:
    """Callbacks of `run_sweep` for a progress view (this base shows nothing)."""

    def skipped(self, point: SweepPoint, state: str) -> None: ...
    def waiting(self, point: SweepPoint) -> None: ...
    def started(self, point: SweepPoint) -> None: ...
    def finished(self, point: SweepPoint, outcome: Outcome) -> None: ...
    def elsewhere(self, point: SweepPoint, state: str) -> None: ...
    def tick(self) -> None: ...


@dataclass
class SweepSummary:
    """What a sweep did: keys found done or failed before, runs made here, keys another
    sweep ran meanwhile ('done' or 'failed'), and runs left unstarted when its start window
    closed."""

    total: int
    done_before: int = 0
    failed_before: list[SweepPoint] = field(default_factory=list)
    ran: list[tuple[SweepPoint, Outcome]] = field(default_factory=list)
    elsewhere: list[tuple[SweepPoint, str]] = field(default_factory=list)
    not_started: list[SweepPoint] = field(default_factory=list)

    @property
    def failed(self) -> list[tuple[SweepPoint, str]]:
        """Points without an ok record at the end, with the reason."""
        out = [(p, o.error or "failed") for p, o in self.ran if o.status != "ok"]
        out += [(p, "failed in an earlier sweep (--retry-failed reruns it)") for p in self.failed_before]
        out += [(p, "failed in another sweep running at the same time") for p, s in self.elsewhere if s != "done"]
        return out


def _job(point: SweepPoint, results: Path) -> Job:
    return Job(point.config_hash, point.mixer, point.task, point.preset, point.config, point.seed, point.device_type,
               str(results))


def run_sweep(
    plan: Plan, executor: Executor, results: Path, retry_failed: bool = False,
    events: SweepEvents | None = None, poll_s: float = 0.25, start_for_s: float | None = None,
) -> SweepSummary:
    """Run every point of `plan` that has no ok record yet (and no failed one, unless
    `retry_failed`), `executor.slots` at a time. Keys another process holds are retried
    once it lets go; if that process wrote a record meanwhile, the key is left to it.

    start_for_s: new runs start only within this many seconds of the call; after it the
    sweep waits for the runs in flight and returns, the rest in `not_started` (for a job
    with a time limit: a run started late would be cut, and would slow the others)."""
    results, events = Path(results), events or SweepEvents()
    summary = SweepSummary(total=len(plan.points))
    todo: deque[SweepPoint] = deque()
    seen: dict[str, frozenset[Path]] = {}
    for point in plan.points:
        recs = key_records(results, point)
        if recs.state == "done" or (recs.state == "failed" and not retry_failed):
            summary.done_before += recs.state == "done"
            if recs.state == "failed":
                summary.failed_before.append(point)
            events.skipped(point, recs.state)
        else:
            todo.append(point)
            seen[point.key] = recs.paths
    in_flight: dict[str, tuple[SweepPoint, Claim]] = {}
    waiting: dict[str, SweepPoint] = {}
    start_until = None if start_for_s is None else time.monotonic() + start_for_s

    def start(point: SweepPoint) -> bool:
        """Claim and submit; False when another process holds the key."""
        claim = try_claim(results, point.key)
        if claim is None:
            if point.key not in waiting:
                waiting[point.key] = point
                events.waiting(point)
            return False
        waiting.pop(point.key, None)
        new = key_records(results, point)
        fresh = new.paths - seen[point.key]
        if fresh:  # another sweep ran it after we looked
            claim.release()
            state = "done" if any(p in fresh for p in new.ok) else "failed"
            summary.elsewhere.append((point, state))
            events.elsewhere(point, state)
            return True
        in_flight[point.key] = (point, claim)
        executor.submit(_job(point, results))
        events.started(point)
        return True

    try:
        while todo or in_flight or waiting:
            if start_until is not None and time.monotonic() >= start_until and (todo or waiting):
                summary.not_started = [*waiting.values(), *todo]
                waiting.clear()
                todo.clear()
            for point in list(waiting.values()):
                if len(in_flight) >= executor.slots:
                    break
                start(point)
            while todo and len(in_flight) < executor.slots:
                start(todo.popleft())
            if in_flight:
                for outcome in executor.poll(poll_s):
                    point, claim = in_flight.pop(outcome.key)
                    claim.release()
                    summary.ran.append((point, outcome))
                    events.finished(point, outcome)
            elif waiting:
                time.sleep(poll_s)
            events.tick()
    finally:
        if in_flight:  # interrupted: stop the runs before letting go of their keys
            executor.abort()
            for _, claim in in_flight.values():
                claim.release()
    return summary
