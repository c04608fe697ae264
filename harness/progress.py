"""Progress display for `harness run` and `harness eval`.

On a terminal this is rich's live bar. Without one (nohup, CI logs, a pipe) a live bar
prints nothing useful, so `LineProgress` prints one plain line per task at most every
`every_s` seconds, plus a line when a task ends: long runs show they are alive in a log.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@dataclass
class _Line:
    description: str
    total: float | None
    completed: float = 0.0
    started: float = field(default_factory=time.monotonic)
    last_print: float = field(default_factory=time.monotonic)


class LineProgress:
    """The rich Progress methods a task calls, printed as throttled plain lines."""

    def __init__(self, console: Console, every_s: float = 30.0):
        self.console, self.every_s = console, every_s
        self._tasks: dict[int, _Line] = {}
        self._next_id = 0

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> int:
        self._next_id += 1
        self._tasks[self._next_id] = _Line(description, total)
        return self._next_id

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def update(self, task_id: int, *, advance: float | None = None, completed: float | None = None,
               total: float | None = None, description: str | None = None, **fields: Any) -> None:
        line = self._tasks.get(task_id)
        if line is None:
            return
        if description is not None:
            line.description = description
        if total is not None:
            line.total = total
        if completed is not None:
            line.completed = completed
        if advance is not None:
            line.completed += advance
        now = time.monotonic()
        if now - line.last_print >= self.every_s:
            line.last_print = now
            self._print(line, now)

    def remove_task(self, task_id: int) -> None:
        line = self._tasks.pop(task_id, None)
        if line is not None:
            self._print(line, time.monotonic(), ended=True)

    def _print(self, line: _Line, now: float, ended: bool = False) -> None:
        elapsed = now - line.started
        if line.total is None and not line.completed:  # a stage without a count: its name and time only
            text = f"{line.description}: {_clock(elapsed)} elapsed"
        else:
            text = f"{line.description}: {line.completed:g}"
            if line.total:
                text += f"/{line.total:g} ({100 * line.completed / line.total:.0f}%)"
            text += f", {_clock(elapsed)} elapsed"
        if ended:
            text += ", done"
        elif line.total and line.completed > 0:
            text += f", ~{_clock(elapsed * (line.total - line.completed) / line.completed)} left"
        self.console.print(text, markup=False, highlight=False)


def make_progress(console: Console) -> Progress | LineProgress:
    """A live rich bar on a terminal, throttled log lines otherwise."""
    if not console.is_terminal:
        return LineProgress(console)
    return Progress(
        SpinnerColumn(), TextColumn("[progress.description]{task.description}"), BarColumn(),
        MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
    )
