"""`harness sweep` and `harness compare` (registered on the main app by harness.cli).

`python -m harness.sweep_cli sweep FILE` / `... compare BASE NEW` run them on their own."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.records import prepare_results
from harness.sweep import Plan, SweepEvents, SweepPoint, SweepSummary, key_records

console = Console()
err_console = Console(stderr=True)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _split(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


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


def _print_plan(plan: Plan, results: Path) -> None:
    table = Table(title=f"{plan.name}: {len(plan.points)} run(s), device {plan.device}")
    for col in ("#", "task", "preset", "mixer", "seed", "overrides", "run key", "state"):
        table.add_column(col)
    styles = {"done": "[green]done[/]", "failed": "[red]failed[/]", "pending": "to run"}
    for i, p in enumerate(plan.points, 1):
        overrides = ", ".join(f"{k}={v}" for k, v in p.overrides) or "–"
        state = key_records(results, p).state
        table.add_row(str(i), p.task, p.preset, p.mixer, str(p.seed), overrides, p.key, styles[state])
    console.print(table)
    if plan.duplicates:
        console.print(f"[dim]{plan.duplicates} duplicate point(s) of the grid dropped (same resolved config).[/]")


def _print_summary(summary: SweepSummary, results: Path) -> None:
    ran_ok = sum(o.status == "ok" for _, o in summary.ran)
    console.print(
        f"[bold]{summary.total}[/] run(s) in the grid: {ran_ok} ran ok here, {summary.done_before} done before, "
        f"{sum(s == 'done' for _, s in summary.elsewhere)} done by another sweep, [red]{len(summary.failed)} failed[/]. "
        f"Records under {results}/runs."
    )
    for point, error in summary.failed:
        err_console.print(f"[red]{point.label}[/] ({point.key}): {error.strip()}")


def sweep_cmd(
    file: Path = typer.Argument(..., help="sweep file (YAML): the grid of mixers x tasks x presets x values x seeds"),
    results: Path = typer.Option(Path("results"), "--results", help="results directory"),
    executor: str = typer.Option("inprocess", "--executor",
                                 help="inprocess (here, one run at a time), gpus (a worker per local GPU) or ray"),
    address: Optional[str] = typer.Option(None, "--address",
                                          help="Ray cluster address (with --executor ray; default: a local Ray)"),
    runs_per_gpu: int = typer.Option(1, "--runs-per-gpu", help="with --executor gpus: worker processes per GPU "
                                     "(N >= 1; small models leave a GPU idle with one)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the expanded grid and the state of each run; run nothing"),
    no_wandb: bool = typer.Option(False, "--no-wandb", help="do not log to wandb"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="rerun runs whose only records are failed ones"),
    task: Optional[str] = typer.Option(None, "--task", help="only these tasks of the sweep (comma-separated)"),
    mixer: Optional[str] = typer.Option(None, "--mixer", help="only these mixers of the sweep (comma-separated)"),
) -> None:
    """Run a sweep file; resumable: runs that already have an ok record are skipped."""
    from harness.executors import ExecutorError, check_runs_per_gpu, make_executor
    from harness.runner import DeviceError, resolve_device
    from harness.sweep import SweepError, expand, load_sweep, run_sweep

    try:
        sweep = load_sweep(file)
        if executor not in ("inprocess", "gpus", "ray"):
            raise ExecutorError(f"--executor {executor!r} is not valid; expected inprocess, gpus or ray")
        check_runs_per_gpu(executor, runs_per_gpu)
        # The device type the runs will get (a Ray cluster may still turn 'auto' into cuda).
        guess = "cuda" if executor == "gpus" else resolve_device(sweep.device if executor == "inprocess" else
                                                                  ("cpu" if sweep.device == "cpu" else "auto")).type
        plan = expand(sweep, guess, _split(task), _split(mixer))
    except (SweepError, ExecutorError, DeviceError) as e:
        raise _fail(str(e)) from None
    if dry_run:
        _print_plan(plan, results)
        return
    try:
        removed = prepare_results(results)
    except ValueError as e:
        raise _fail(str(e)) from None
    if removed:
        console.print(f"[yellow]warning:[/] removed {removed} temp file(s) left by record writes that were killed")
    try:
        runner = make_executor(executor, sweep.device, results, wandb=not no_wandb, address=address, runs_per_gpu=runs_per_gpu)
    except (ExecutorError, DeviceError) as e:
        raise _fail(str(e)) from None
    if runner.device_type != guess:
        plan.points = [dataclasses.replace(p, device_type=runner.device_type) for p in plan.points]
    try:
        view = SweepView(plan, runner.slots, runner.where)
        if hasattr(runner, "progress"):
            runner.progress = view.progress  # the in-process runs show their own bars
        console.print(f"[bold]{plan.name}[/]: {len(plan.points)} run(s) on {runner.where} → {results}/runs")
        with view.progress:
            summary = run_sweep(plan, runner, results, retry_failed=retry_failed, events=view)
    except KeyboardInterrupt:
        raise _fail("interrupted; finished runs are recorded: run the same command again to resume", 130) from None
    except ExecutorError as e:
        raise _fail(str(e)) from None
    finally:
        runner.close()
    _print_summary(summary, results)
    if summary.failed:
        raise typer.Exit(1)


def compare_cmd(
    base: Path = typer.Argument(..., help="baseline: a results directory (or any folder of records) or a record file"),
    new: Path = typer.Argument(..., help="the new results, same forms as BASE"),
    threshold: str = typer.Option("5%", "--threshold", help="a change worse than this fails (e.g. 5% or 0.05)"),
    ignore: Optional[list[str]] = typer.Option(None, "--ignore",
                                               help="metric name pattern shown but not gated (glob; repeatable)"),
    changed_only: bool = typer.Option(False, "--changed-only", help="show only rows beyond the threshold"),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="also write the table as Markdown to this file"),
) -> None:
    """Compare two sets of run records metric by metric; exit 1 on a regression beyond the threshold."""
    from harness.compare import CompareError, compare, fmt_change, fmt_value, parse_threshold, to_markdown

    try:
        result = compare(base, new, parse_threshold(threshold), ignore or [])
    except CompareError as e:
        raise _fail(str(e)) from None
    table = Table(title=f"{base} → {new} (threshold {result.threshold:.1%})")
    table.add_column("run (mixer · task/preset · device · setting)", overflow="fold", ratio=1)
    table.add_column("metric", overflow="fold")
    for col in ("base", "new", "change", "verdict"):
        table.add_column(col, no_wrap=True, justify="left" if col == "verdict" else "right")
    styles = {"regression": "bold red", "failed": "bold red", "improved": "green", "ok": "", "not gated": "dim"}
    previous = None
    for r in result.rows:
        if changed_only and r.verdict not in ("regression", "improved", "failed"):
            continue
        task, mixer, preset, device, setting = r.key
        run = "" if r.key == previous else f"{mixer} · {task}/{preset} · {device} · {setting}"
        previous = r.key
        verdict = "failed in NEW" if r.verdict == "failed" else r.verdict
        table.add_row(run, r.metric, fmt_value(r.base), fmt_value(r.new), fmt_change(r), verdict, style=styles[r.verdict])
    console.print(table)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(to_markdown(result, changed_only))
    console.print(f"{len({r.key for r in result.rows})} run(s) compared; {len(result.only_base)} only in BASE, "
                  f"{len(result.only_new)} only in NEW.")
    for label, keys in (("only in BASE", result.only_base), ("only in NEW", result.only_new)):
        for task, mixer, preset, device, setting in keys[:20]:
            console.print(f"[dim]  {label}: {mixer} · {task}/{preset} · {device} · {setting}[/]")
    if not result.rows:
        raise _fail("no run in common between BASE and NEW: nothing was compared")
    if result.regressions:
        err_console.print(f"[bold red]{len(result.regressions)} regression(s) beyond {result.threshold:.1%}[/]")
        raise typer.Exit(1)
    console.print(f"[green]no regression beyond {result.threshold:.1%}[/]")


app = typer.Typer(add_completion=False, no_args_is_help=True, help="harness sweep / compare")
app.command("sweep")(sweep_cmd)
app.command("compare")(compare_cmd)

if __name__ == "__main__":
    app()
