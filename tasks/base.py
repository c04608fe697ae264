"""The task contract (DESIGN §5): a task takes a mixer name, a resolved config and a
device, and returns a TaskResult that the harness turns into a run record."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol

import torch
from pydantic import BaseModel, ConfigDict


class TaskConfig(BaseModel):
    """Base of every task's config: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


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
    progress: Progress = field(default_factory=NullProgress)
    log: Callable[[dict[str, float], int | None], None] = lambda metrics, step=None: None


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

    @classmethod
    def check_mixer(cls, mixer: str) -> None:
        """Raise ValueError (naming the valid mixers) when this task cannot run `mixer`.

        The harness calls it before any run starts, so a mixer the task does not take is
        bad input (exit 2, no record), not a failed run. Default: every mixer is taken."""

    def run(self, ctx: RunContext) -> TaskResult:
        raise NotImplementedError
