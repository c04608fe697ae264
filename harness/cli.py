"""The `harness` command line: list, run, leaderboard, sweep, compare, dashboard, eval."""

from __future__ import annotations

import os
import signal
import warnings
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.progress import make_progress
from harness.records import SEED_MAX

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Benchmark and evaluate sequence mixers.")
# Piped output (CI logs, files) gets a wide fixed width instead of rich's 80 columns.
console = Console(width=None if Console().is_terminal else 160)
err_console = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 160)

# Hugging Face libraries stay offline unless the user says otherwise.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _print_version(value: bool) -> None:
    if value:
        from harness import __version__

        console.print(f"harness {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="print the harness version and exit")) -> None:
    """Benchmark and evaluate sequence mixers."""


def fail(message: str, code: int = 2) -> "typer.Exit":
    err_console.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code)


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}")


@app.command("list")
def list_cmd() -> None:
    """Mixers, tasks and backends, and whether each backend can run here."""
    import torch

    from kernels import backend_status
    from kernels.common.dispatch import ALL_BACKENDS
    from kernels.softmax_attention.spec import explain_auto
    from mixers import get_mixer, mixer_names
    from tasks import get_task, task_names

    mixers = Table(title="Mixers")
    for col in ("name", "op", "options"):
        mixers.add_column(col)
    for name in mixer_names():
        cls = get_mixer(name)
        mixers.add_row(name, cls.op_name, ", ".join(cls.Config.model_fields))
    console.print(mixers)

    tasks = Table(title="Tasks")
    for col in ("name", "presets", "description"):
        tasks.add_column(col)
    for name in task_names():
        cls = get_task(name)
        tasks.add_row(name, ", ".join(cls.presets), cls.description)
    console.print(tasks)

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    backends = Table(title="Backends")
    backends.add_column("backend")
    backends.add_column("ops")
    for d in devices:
        backends.add_column(f"on {d}")
    for b in (*ALL_BACKENDS, "fla"):
        cells = []
        for d in devices:
            st = backend_status(b, d)
            cells.append(("[green]yes[/] " if st.usable else "[red]no[/] ") + escape(st.reason))
        backends.add_row(b, _ops_with_backend(b), *cells)
    console.print(backends)
    # "auto" for softmax depends on the dtype too: one line per device for half and full precision.
    for d in devices:
        for dtype in (torch.bfloat16, torch.float32):
            console.print(f"softmax_attention {escape(explain_auto(d, dtype))}", highlight=False)
    if not torch.cuda.is_available():
        console.print("[dim]No CUDA device here: the triton backend runs only under TRITON_INTERPRET=1 (tests).[/]")


def _ops_with_backend(backend: str) -> str:
    """The registered ops that have `backend` ("fla": those with an FLA kernel to compare with)."""
    from kernels.registry import SPECS

    if backend == "fla":
        names = [name for name, spec in SPECS.items() if spec.fla]
    else:
        names = [name for name, spec in SPECS.items() if backend in spec.backends]
    return "all" if len(names) == len(SPECS) else ", ".join(names)


def _progress():
    """rich's live bar on a terminal; throttled plain lines in logs and pipes."""
    return make_progress(console)


@app.command("run")
def run_cmd(
    mixer: str = typer.Option(..., "--mixer", "-m", help="mixer name(s), comma-separated"),
    task: str = typer.Option(..., "--task", "-t", help="task name"),
    device: str = typer.Option("auto", help="auto, cpu or cuda"),
    seed: int = typer.Option(0, help=f"random seed, 0 to {SEED_MAX}"),
    preset: str = typer.Option("default", help="named preset of the task"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="override a config key: key=value (dotted keys)"),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML/JSON file of config overrides"),
    results: Path = typer.Option(Path("results"), "--results", help="results directory"),
    no_wandb: bool = typer.Option(False, "--no-wandb", help="do not log to wandb"),
    log_every: int = typer.Option(50, "--log-every", min=1, help="training steps between logged loss/lr points"),
) -> None:
    """Run a task for one or more mixers; writes one record per (mixer, task)."""
    from harness.config import ConfigError, check_mixer_run, check_seed, check_task_config, resolve_config
    from harness.runner import DeviceError, RunSpec, execute, resolve_device
    from harness.tracking import Tracker
    from mixers import UnknownMixerError, get_mixer
    from tasks import UnknownTaskError, get_task

    names = [m.strip() for m in mixer.split(",") if m.strip()]
    if not names:
        raise fail("--mixer is empty; give one or more mixer names, comma-separated")
    try:
        task_cls = get_task(task)
        for name in names:
            get_mixer(name)
        check_seed(seed)
        dev = resolve_device(device)
        cfg = resolve_config(task_cls, preset, config, set_ or [])
        check_task_config(task_cls, cfg, dev.type)
        for name in names:
            check_mixer_run(task_cls, name, cfg, dev.type)
        _prepare(results)
    except (UnknownMixerError, UnknownTaskError, DeviceError, ConfigError, ValueError) as e:
        raise fail(str(e)) from None

    tracker = Tracker(enabled=not no_wandb, log_every=log_every)
    rows, failed = [], 0
    with _progress() as progress:
        overall = progress.add_task(f"{task} ({preset}) on {dev}", total=len(names))
        for name in names:
            progress.update(overall, description=f"{task} · {name} ({preset}) on {dev}")
            record, path = execute(RunSpec(name, task_cls, preset, cfg, dev, seed), results, tracker, progress)
            rows.append((record, path))
            failed += record.status != "ok"
            progress.advance(overall)
    _print_results(rows, task_cls)
    if failed:
        kinds = sorted({rec.status for rec, _ in rows if rec.status != "ok"})
        raise fail(f"{failed} of {len(rows)} run(s) {' or '.join(kinds)}; see the records above", code=1)


def _prepare(results: Path) -> None:
    """The results folder takes records (ValueError if not); orphan temp records are cleaned."""
    from harness.records import prepare_results

    removed = prepare_results(results)
    if removed:
        err_console.print(f"[yellow]warning:[/] removed {removed} temp file(s) left by record writes that were killed")


def _status_markup(rec) -> str:
    """ok (green), ok but at chance (yellow: the loss never left the chance level), diverged, oom, failed."""
    if rec.status == "ok":
        return "[yellow]ok, at chance[/]" if rec.metrics.get("learned") == 0.0 else "[green]ok[/]"
    return {"diverged": "[yellow]diverged[/]", "oom": "[yellow]oom[/]"}.get(rec.status, "[red]failed[/]")


def _print_results(rows, task_cls) -> None:
    table = Table(title="Runs")
    shown = [task_cls.primary_metric, *task_cls.shown_metrics]
    for col in ("mixer", "status", *shown, "backend", "time (s)", "record"):
        table.add_column(col)
    for rec, path in rows:
        values = [f"{rec.metrics[m]:.4g}" if m in rec.metrics else "–" for m in shown]
        status = _status_markup(rec)
        table.add_row(rec.mixer, status, *values, rec.backend or "–", f"{rec.duration_s:.1f}", str(path))
    console.print(table)
    for rec, _ in rows:
        if rec.status != "ok":
            err_console.print(f"[red]{rec.mixer}:[/] {escape(rec.error or '')}")
        elif rec.metrics.get("learned") == 0.0:
            err_console.print(f"[yellow]{rec.mixer}:[/] final loss {rec.metrics['final_loss']:.3f} is at the chance "
                              f"level ({rec.metrics['chance_loss']:.3f}): the model did not learn the task")


def _cell(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "–"


def _fitting_columns(board, width: int) -> list[str]:
    """The board's key columns that fit `width` beside mixer, runs and a 16-wide config column."""
    def wide(header: str, cells: list[str]) -> int:
        return max([len(header), *(len(c) for c in cells)]) + 3

    used = wide("mixer", [f"{r['mixer']} (at chance)" for r in board.rows]) + wide("runs", []) + 16 + 4
    fits = []
    for col in board.key_columns():
        need = wide(col, [_cell(r[col]) for r in board.rows])
        if fits and used + need > width:
            break
        fits.append(col)
        used += need
    return fits


@app.command("leaderboard")
def leaderboard_cmd(
    results: Path = typer.Option(Path("results"), "--results", help="results directory"),
) -> None:
    """Tables of the best run per mixer and task setting, from the records; writes LEADERBOARD.md."""
    from harness.leaderboard import build_boards, to_markdown
    from harness.records import reporting_unreadable

    if not Path(results).is_dir():
        raise fail(f"--results {results} is not a directory (records live under <results>/runs)")
    with reporting_unreadable(warn):
        boards, count = build_boards(results)
    # Piped, the tables take COLUMNS when it is set (they are the one output sized to a screen).
    columns = os.environ.get("COLUMNS", "")
    out_console = Console(width=int(columns)) if not console.is_terminal and columns.isdigit() else console
    for b in boards:
        # The terminal gets the key metrics; every column is in LEADERBOARD.md and the dashboard.
        key = _fitting_columns(b, out_console.width)
        table = Table(title=b.title, title_justify="left")
        table.add_column("mixer", no_wrap=True)
        for col in key:
            table.add_column(col.removeprefix("accuracy_") if col != b.metric else col, justify="right", no_wrap=True)
        table.add_column("runs", justify="right", no_wrap=True)
        table.add_column("config", overflow="fold", ratio=1)
        for row in b.rows:
            mixer = f"{row['mixer']} (at chance)" if row.get("learned") == 0.0 else row["mixer"]
            table.add_row(mixer, *(_cell(row[c]) for c in key),
                          str(row["runs"]), row["config"])
        out_console.print(table)
        hidden = len(b.columns) - len(key)
        if hidden:
            out_console.print(f"[dim]{hidden} more column(s) of this table in LEADERBOARD.md[/]")
    out = Path(results) / "LEADERBOARD.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".md.tmp")
    tmp.write_text(to_markdown(boards, count, results))
    os.replace(tmp, out)
    console.print(f"{len(boards)} table(s) from {count} record(s); written to {out}")


def _register_commands() -> None:
    """Commands that live in their own modules (kept out of this file to keep it small)."""
    from harness.dashboard_cli import dashboard_cmd
    from harness.eval_cli import eval_cmd
    from harness.sweep_cli import compare_cmd, sweep_cmd

    app.command("sweep")(sweep_cmd)
    app.command("compare")(compare_cmd)
    app.command("dashboard")(dashboard_cmd)
    app.command("eval")(eval_cmd)


_register_commands()


def _show_record_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Skipped records print as one plain warning line each; other warnings as Python prints them."""
    from harness.records import UnreadableRecordWarning

    if issubclass(category, UnreadableRecordWarning):
        err_console.print(f"[yellow]warning:[/] {escape(str(message))}")
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM stops a run or a sweep as Ctrl-C does: nothing half-written


def main() -> None:
    warnings.showwarning = _show_record_warning
    signal.signal(signal.SIGTERM, _terminate)
    app()


if __name__ == "__main__":
    main()
