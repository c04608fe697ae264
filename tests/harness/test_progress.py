"""Progress lines for runs without a terminal (nohup, CI logs)."""

import io

from rich.console import Console

from harness.progress import LineProgress, make_progress


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=200), buf


def test_not_a_terminal_gets_line_progress():
    console, _ = _console(False)
    assert isinstance(make_progress(console), LineProgress)
    console, _ = _console(True)
    assert not isinstance(make_progress(console), LineProgress)


def test_lines_show_counts_percent_and_end():
    console, buf = _console(False)
    progress = LineProgress(console, every_s=0.0)
    task = progress.add_task("train gdn", total=200)
    for _ in range(50):
        progress.update(task, advance=1, description="train gdn loss 5.123")
    progress.remove_task(task)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("train gdn loss 5.123: 1/200 (0%)")
    assert "50/200 (25%)" in lines[-2] and "left" in lines[-2]
    assert lines[-1].endswith("done") and len(lines) == 51


def test_lines_are_throttled():
    console, buf = _console(False)
    progress = LineProgress(console, every_s=3600.0)
    task = progress.add_task("eval", total=None)
    for _ in range(100):
        progress.advance(task)
    assert buf.getvalue() == ""
    progress.remove_task(task)
    assert buf.getvalue().strip().startswith("eval: 100, ")
