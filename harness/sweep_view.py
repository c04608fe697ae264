"""What `harness sweep` shows: the live view of a sweep, its plan and its summary. Imported
only when a sweep runs, so `harness --help` does not import torch through harness.sweep."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.runner import resume_dir
from harness.sweep import Plan, SweepEvents, SweepPoint, SweepSummary, key_records
from tasks.common.resume import STATE_FILE

console = Console()
err_console = Console(stderr=True)


class _EtaColumn(ProgressColumn):
    """The sweep's own ETA (blank on the tasks' bars, which have none)."""

    def render(self, task):
        return task.fields.get("eta", "")


class SweepView(SweepEvents):
    """The live view: one bar for the whole sweep (done / running / failed / waiting /
    left, ETA from the runs finished so far) and a spinner per run in flight; a line per
    finished run, so logs without a terminal show progress too."""

    def __init__(self, plan: Plan, slots: int, where: str):
        self.plan, self.slots, self.where = plan, slots, where
        self.progress = Progress(
            SpinnerColumn(), TextColumn("[progress.description]{task.description}"), BarColumn(),
            MofNCompleteColumn(), TimeElapsedColumn(), _EtaColumn(), console=console,
        )
        self.counts = {"done": 0, "failed": 0, "running": 0}
        self.held: set[str] = set()  # keys another sweep is running
        self.durations: list[float] = []
        self.running: dict[str, tuple[int, float]] = {}
        self.overall = self.progress.add_task("", total=len(plan.points), eta="ETA –")
        self._refresh()

    def _refresh(self) -> None:
        c = self.counts
        left = len(self.plan.points) - c["done"] - c["failed"] - c["running"]
        eta = "ETA –"
        if left + c["running"] == 0:
            eta = ""
        elif self.durations:
            mean = sum(self.durations) / len(self.durations)
            eta = f"ETA {_duration(mean * (left + c['running'] / 2) / self.slots)}"
        waiting = f" · [yellow]{len(self.held)} held by another sweep[/]" if self.held else ""
        text = (f"[bold]{self.plan.name}[/] [green]{c['done']} done[/] · [cyan]{c['running']} running[/] · "
                f"[red]{c['failed']} failed[/] · {left} left{waiting}")
        self.progress.update(self.overall, description=text, completed=c["done"] + c["failed"], eta=eta)

    def skipped(self, point: SweepPoint, state: str) -> None:
        self.counts["done" if state == "done" else "failed"] += 1
        self._refresh()

    def waiting(self, point: SweepPoint) -> None:
        self.held.add(point.key)
        console.print(f"[yellow]…[/] {point.label}: another sweep is running it; waiting")
        self._refresh()

    def started(self, point: SweepPoint) -> None:
        self.held.discard(point.key)
        self.counts["running"] += 1
        self.running[point.key] = (self.progress.add_task(f"  [cyan]{point.label}", total=None), time.monotonic())
        self._refresh()

    def finished(self, point: SweepPoint, outcome) -> None:
        task_id, t0 = self.running.pop(point.key)
        self.progress.remove_task(task_id)
        self.counts["running"] -= 1
        self.durations.append(time.monotonic() - t0)
        ok = outcome.status == "ok"
        self.counts["done" if ok else "failed"] += 1
        mark = "[green]✓[/]" if ok else {"diverged": "[yellow]✗ diverged[/]", "oom": "[yellow]✗ oom[/]"}.get(
            outcome.status, "[red]✗[/]")
        error = "" if ok else f": [red]{(outcome.error or 'failed').splitlines()[0]}[/]"
        console.print(f"{mark} {point.label} ({_duration(outcome.duration_s)}, {outcome.where}){error}")
        self._refresh()

    def elsewhere(self, point: SweepPoint, state: str) -> None:
        self.held.discard(point.key)
        self.counts["done" if state == "done" else "failed"] += 1
        console.print(f"[dim]·[/] {point.label}: {state} by another sweep")
        self._refresh()


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def print_plan(plan: Plan, results: Path) -> None:
    table = Table(title=f"{plan.name}: {len(plan.points)} run(s), device {plan.device}")
    for col in ("#", "task", "preset", "mixer", "seed", "overrides", "run key", "state"):
        table.add_column(col)
    styles = {"done": "[green]done[/]", "failed": "[red]failed[/]", "pending": "to run"}
    for i, p in enumerate(plan.points, 1):
        overrides = ", ".join(f"{k}={v}" for k, v in p.overrides) or "–"
        state = styles[key_records(results, p).state]
        if state == styles["pending"] and (resume_dir(results, p.task, p.config_hash, p.device_type) / STATE_FILE).exists():
            state = "to run, resumes"  # a cut-short run's training state is waiting for it
        table.add_row(str(i), p.task, p.preset, p.mixer, str(p.seed), overrides, p.key, state)
    console.print(table)
    if plan.duplicates:
        console.print(f"[dim]{plan.duplicates} duplicate point(s) of the grid dropped (same resolved config).[/]")


def print_summary(summary: SweepSummary, results: Path) -> None:
    ran_ok = sum(o.status == "ok" for _, o in summary.ran)
    console.print(
        f"[bold]{summary.total}[/] run(s) in the grid: {ran_ok} ran ok here, {summary.done_before} done before, "
        f"{sum(s == 'done' for _, s in summary.elsewhere)} done by another sweep, [red]{len(summary.failed)} failed[/]. "
        f"Records under {results}/runs."
    )
    if summary.not_started:
        console.print(f"[yellow]{len(summary.not_started)} run(s) not started[/]: the start window "
                      "(--start-for) closed first; run the same command again to go on")
    for point, error in summary.failed:
        err_console.print(f"[red]{point.label}[/] ({point.key}): {error.strip()}")
