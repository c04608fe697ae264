"""`harness sweep` and `harness compare` (registered on the main app by harness.cli).

`python -m harness.sweep_cli sweep FILE` / `... compare BASE NEW` run them on their own."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from harness.records import prepare_results, reporting_unreadable

console = Console()
err_console = Console(stderr=True)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _split(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


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
    start_for: Optional[float] = typer.Option(None, "--start-for", help="start new runs only during the first "
                                              "SECONDS (> 0), then wait for those in flight and stop"),
    where: Optional[list[str]] = typer.Option(None, "--where", help="only runs whose `set`/`vary` value KEY is "
                                              "VALUE: KEY=VALUE, e.g. model.d_model=256, or one of several: "
                                              "KEY=V1,V2 (repeatable, all must hold; numbers compare as numbers)"),
    key: Optional[str] = typer.Option(None, "--key", help="only the runs whose key starts with one of these "
                                      "prefixes (comma-separated, >= 6 hex digits each, as --dry-run prints "
                                      "them), started in the order given"),
) -> None:
    """Run a sweep file; resumable: runs that already have an ok record are skipped."""
    from harness.executors import ExecutorError, check_executor, make_executor
    from harness.runner import DeviceError, resolve_device
    from harness.sweep import SweepError, expand, load_sweep, run_sweep, select_keys, select_where
    from harness.sweep_view import SweepView, print_plan, print_summary

    if start_for is not None and not start_for > 0:
        raise _fail(f"--start-for {start_for}: give the seconds (> 0) during which new runs may start")
    try:
        sweep = load_sweep(file)
        check_executor(executor, sweep.device, runs_per_gpu, address, runs_here=not dry_run)
        # The device type the runs will get (a Ray cluster may still turn 'auto' into cuda).
        guess = "cuda" if executor == "gpus" else resolve_device(sweep.device if executor == "inprocess" else
                                                                  ("cpu" if sweep.device == "cpu" else "auto")).type
        plan = expand(sweep, guess, _split(task), _split(mixer))
        if where:
            plan = select_where(plan, where)
        if key:
            plan = select_keys(plan, _split(key))
    except (SweepError, ExecutorError, DeviceError) as e:
        raise _fail(str(e)) from None
    from harness.cli import warn

    if dry_run:
        with reporting_unreadable(warn):
            print_plan(plan, results)
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
        with view.progress, reporting_unreadable(warn):
            summary = run_sweep(plan, runner, results, retry_failed=retry_failed, events=view,
                                start_for_s=start_for)
    except KeyboardInterrupt:
        raise _fail("interrupted; finished runs are recorded: run the same command again to resume", 130) from None
    except ExecutorError as e:
        raise _fail(str(e)) from None
    finally:
        runner.close()
    print_summary(summary, results)
    if summary.failed:
        raise typer.Exit(1)


def _check_writable(option: str, path: Path) -> None:
    """CompareError naming `option` when no file can be written at `path`; creates nothing, so a
    refused command leaves no folder behind."""
    from harness.compare import CompareError

    if path.is_dir():
        raise CompareError(f"{option} {path} is a folder; give the path of a file to write")
    existing = path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise CompareError(f"{option} {path}: cannot write there, {existing} is a file")
    if not os.access(existing, os.W_OK):
        raise CompareError(f"{option} {path}: cannot write there, {existing} is not writable")


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
    from harness.cli import warn
    from harness.compare import CompareError, compare, fmt_change, fmt_value, parse_threshold, to_markdown

    try:
        if markdown is not None:
            _check_writable("--markdown", markdown)
        with reporting_unreadable(warn):
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
        try:
            markdown.parent.mkdir(parents=True, exist_ok=True)
            markdown.write_text(to_markdown(result, changed_only))
        except OSError as e:
            raise _fail(f"--markdown {markdown}: cannot write the report ({e.strerror or e})") from None
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
