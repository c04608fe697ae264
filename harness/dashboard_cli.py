"""`harness dashboard`: build the static dashboard page from run records, optionally serve it.

Registered by harness.cli as `app.command("dashboard")(dashboard_cmd)`."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def dashboard_cmd(
    results: Path = typer.Option(Path("results"), "--results", help="results directory (records under runs/)"),
    out: Optional[Path] = typer.Option(None, "--out", help="output folder; default <results>/dashboard"),
    serve: bool = typer.Option(False, "--serve", help="serve the page on 127.0.0.1 after building it"),
    port: Optional[int] = typer.Option(None, "--port", help="port for --serve (default 8000; 0 picks a free one)"),
    threshold: float = typer.Option(0.10, "--regression-threshold",
                                    help="relative change in the worse direction that flags a regression"),
) -> None:
    """A static web page of tables and plots from the run records: writes <out>/index.html."""
    from harness.cli import warn
    from harness.dashboard import build_dashboard
    from harness.dashboard import serve as make_server
    from harness.dashboard.page import PlotlyMissingError
    from harness.records import reporting_unreadable

    if port is not None and not serve:
        err_console.print("[bold red]error:[/] --port needs --serve")
        raise typer.Exit(2)
    if port is not None and not 0 <= port <= 65535:
        err_console.print(f"[bold red]error:[/] --port {port} is out of range; valid ports: 0 to 65535 (0 picks a free one)")
        raise typer.Exit(2)
    if not math.isfinite(threshold) or threshold <= 0:
        err_console.print(f"[bold red]error:[/] --regression-threshold must be > 0 and finite (e.g. 0.1 = 10%), "
                          f"got {threshold}")
        raise typer.Exit(2)
    if not Path(results).is_dir():
        err_console.print(f"[bold red]error:[/] --results {results} is not a directory")
        raise typer.Exit(2)
    target = Path(out) if out is not None else Path(results) / "dashboard"
    try:
        target.mkdir(parents=True, exist_ok=True)
        if not os.access(target, os.W_OK):
            raise PermissionError(f"{target} is not writable")
    except OSError as e:
        err_console.print(f"[bold red]error:[/] --out {target}: cannot write the page there ({e.strerror or e})")
        raise typer.Exit(2) from None
    try:
        with reporting_unreadable(warn):
            built = build_dashboard(results, out, threshold)
    except (PlotlyMissingError, ValueError) as e:
        err_console.print(f"[bold red]error:[/] {e}")
        raise typer.Exit(2) from None
    except OSError as e:
        err_console.print(f"[bold red]error:[/] writing the dashboard failed: {e}")
        raise typer.Exit(2) from None
    console.print(f"{built.figures} figure(s) from {built.records} record(s), {built.linked} record(s) linked; "
                  f"written to {built.page}")
    for warning in built.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}")
    if built.regressions:
        console.print(f"[bold red]{built.regressions} regression(s)[/] flagged in the latest runs (see the History section)")
    if not serve:
        return
    try:
        server = make_server(built.page.parent, 8000 if port is None else port)
    except (OSError, ValueError) as e:
        err_console.print(f"[bold red]error:[/] cannot serve on 127.0.0.1:{port}: {e}")
        raise typer.Exit(2) from None
    host, bound = server.server_address[:2]
    console.print(f"Serving {built.page.parent} at http://{host}:{bound}/ (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
