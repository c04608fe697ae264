"""The task contract (docs/design.md §5): a task takes a mixer name, a resolved config and a
device, and returns a TaskResult that the harness turns into a run record."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict


class TaskConfig(BaseModel):
    """Base of every task's config: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # inf or nan is never a valid setting


class Progress(Protocol):
    """The slice of rich.progress.Progress a task uses (the harness passes a real one)."""

    def add_task(self, description: str, total: float | None = ..., **fields: Any) -> Any: ...
    def advance(self, task_id: Any, advance: float = 1) -> None: ...
    def update(self, task_id: Any, **kwargs: Any) -> None: ...
    def remove_task(self, task_id: Any) -> None: ...


class NullProgress:
    """A Progress that shows nothing (library use, tests)."""

    def add_task(self, description, total=None, **fields):
        return 0

    def advance(self, task_id, advance=1):
        pass

    def update(self, task_id, **kwargs):
        pass

    def remove_task(self, task_id):
        pass


@dataclass
class RunContext:
    """What the harness hands a task for one (mixer, task) run."""

    mixer: str
    config: Any  # the task's resolved TaskConfig
    device: torch.device
    seed: int
    artifact_dir: Path  # plots and other files go here, next to the record
    resume_dir: Path | None = None  # training state between epochs (tasks.common.resume); None: not saved
    progress: Progress = field(default_factory=NullProgress)
    log: Callable[[dict[str, float], int | None], None] = lambda metrics, step=None: None
    log_every: int = 50  # training steps between logged points


@contextlib.contextmanager
def stage(ctx: RunContext, what: str) -> Iterator[None]:
    """Show `what` the run is doing (a line with a spinner) for the duration of the block."""
    task_id = ctx.progress.add_task(f"{ctx.mixer}: {what}", total=None)
    try:
        yield
    finally:
        ctx.progress.remove_task(task_id)


class RunDiverged(RuntimeError):
    """Training became non-finite: the run's record gets status "diverged", not "failed"."""


class RunOutOfMemory(RuntimeError):
    """The run did not fit in memory: the record gets status "oom", not "failed"."""


# A trained run "learned" when its final loss is below this share of the task's chance loss.
LEARNED_BELOW = 0.9


@dataclass
class TaskResult:
    """What a task returns: flat metrics, the backend that really ran, and extras.

    `details` holds structured results (tables, curves) kept in the record;
    `artifacts` are file names written into `RunContext.artifact_dir`."""

    metrics: dict[str, float]
    backend: str
    details: dict[str, Any] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)


class Task:
    """Base of a registered task: a config class, named presets, and `run`."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[TaskConfig]] = TaskConfig
    presets: ClassVar[dict[str, dict[str, Any]]] = {"default": {}}
    description: ClassVar[str] = ""
    # How the leaderboard ranks runs: the metric, its direction, the config fields that
    # define a task setting (runs that differ only in other fields compete), and the
    # metrics shown beside it.
    primary_metric: ClassVar[str] = "accuracy"
    higher_is_better: ClassVar[bool] = True
    setting_fields: ClassVar[tuple[str, ...]] = ()
    shown_metrics: ClassVar[tuple[str, ...]] = ()
    # Which `<primary>_*` metrics a leaderboard shows beside the primary one (a regular
    # expression matched against the whole name); empty: all of them.
    board_metrics: ClassVar[str] = ""
    # Which runs share a board: all CPUs together and each GPU model ("class": results that do not
    # depend on the processor, such as accuracy), or each exact CPU and GPU model ("model": timings).
    board_device: ClassVar[Literal["class", "model"]] = "class"
    # Config fields (dotted paths, e.g. "model.d_model") whose values split a setting's board:
    # one table per value, so a width sweep shows each mixer's best run at every width.
    board_split: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def check_mixer(cls, mixer: str) -> None:
        """Raise ValueError (naming the valid mixers) when this task cannot run `mixer`.

        The harness calls it before any run starts, so a mixer the task does not take is
        bad input (exit 2, no record), not a failed run. Default: every mixer is taken."""

    @classmethod
    def check_config(cls, config: TaskConfig, device_type: str) -> None:
        """Raise ValueError (what is wrong, what is valid) when `config` cannot run on a device of
        `device_type` ("cpu" or "cuda"): missing paths, options the device lacks. The harness
        calls it before any run starts (exit 2, no record). Default: nothing to check."""

    @classmethod
    def chance_loss(cls, config: TaskConfig) -> float | None:
        """The cross-entropy of guessing uniformly among the answers `config` allows (nats),
        for tasks that train and report `final_loss`; None for the others. The harness then
        records `learned` (1.0 when final_loss < LEARNED_BELOW x chance_loss, else 0.0)."""
        return None

    def run(self, ctx: RunContext) -> TaskResult:
        raise NotImplementedError


def learned_metrics(task: type[Task], config: TaskConfig, metrics: dict[str, float]) -> dict[str, float]:
    """chance_loss and learned (1.0 / 0.0) for a task that trains; {} for the others."""
    chance = task.chance_loss(config)
    if chance is None or "final_loss" not in metrics:
        return {}
    return {"chance_loss": chance, "learned": float(metrics["final_loss"] < LEARNED_BELOW * chance)}
