"""Build the dashboard from run records only: collect the records, derive tables and figures,
render one self-contained page to <out>/index.html and copy every record the page links to
into <out>/records/<task>/<run_id>.json (so the links work on any static host)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape
from pathlib import Path

from harness.dashboard import history as hist
from harness.dashboard.common import RECORDS_DIR, Item, Section, group_by_setting
from harness.dashboard.page import render
from harness.dashboard.perf import memory_figures, throughput_figures
from harness.dashboard.recall import fidelity_figures, mqar_figures, niah_figures
from harness.dashboard.tables import failed_table, filter_bar, history_table, leaderboard_html, regression_banner
from harness.leaderboard import build_boards
from harness.records import load_records

DEFAULT_THRESHOLD = 0.10  # relative change in the worse direction that flags a regression
PAGE = "index.html"


@dataclass(frozen=True)
class BuildResult:
    page: Path
    records: int  # records read
    linked: int  # records copied next to the page
    figures: int
    regressions: int  # series whose latest run is a regression
    warnings: tuple[str, ...] = ()  # sections that could not be drawn, and why


def _how_to_fill(task: str, mixers: str = "softmax,gdn") -> str:
    return f"No <code>{task}</code> records yet: <code>harness run --mixer {mixers} --task {task}</code> makes some."


def collect(results: Path) -> list[Item]:
    """Every readable record under <results>/runs with its path relative to `results`."""
    results = Path(results)
    return [Item(path, rec, path.relative_to(results).as_posix()) for path, rec in load_records(results)]


def build_sections(results: Path, items: list[Item], threshold: float,
                   warnings: list[str]) -> tuple[list[Section], list[Item], list[hist.Series]]:
    """The page's sections, the records they link to, and the history series; problems go to `warnings`."""
    ok = [it for it in items if it.rec.status == "ok"]
    failed = [it for it in items if it.rec.status != "ok"]
    by_task = {t: [it for it in ok if it.rec.task == t] for t in {it.rec.task for it in ok}}
    linked: list[Item] = list(failed)

    boards, _ = build_boards(results)
    board_html, board_items = leaderboard_html(boards, {it.rel: it for it in items})
    linked += board_items
    leaderboard = Section(
        "leaderboard", "Leaderboard",
        "Derived from the run records only (the same ranking as <code>harness leaderboard</code>). "
        "The filters apply to every table on the page.",
        html=(filter_bar(items) + board_html + failed_table(failed)) if items else "",
        empty="No run records yet: <code>harness run --mixer softmax,linear,gdn --task mqar</code> makes some.",
    )

    def section(sec_id: str, title: str, intro: str, task: str, figures, with_device: bool, mixers: str = "softmax,gdn"):
        if not by_task.get(task):
            return Section(sec_id, title, intro, empty=_how_to_fill(task, mixers))
        try:
            figs = figures(group_by_setting(by_task[task], with_device=with_device))
        except Exception as e:  # noqa: BLE001 - records of another shape: the rest of the page still builds
            warnings.append(f"{task}: cannot draw figures from these records ({type(e).__name__}: {e})")
            return Section(sec_id, title, intro, empty=f"Could not draw figures from the {task} records: "
                           f"<code>{escape(type(e).__name__)}: {escape(str(e))}</code>")
        return Section(sec_id, title, intro, figs, empty=f"The {task} records hold no data these figures use.")

    sections = [
        leaderboard,
        section("throughput", "Throughput", "Tokens per second against sequence length, and decode latency, per "
                "device and preset; softmax attention is measured in every run as the baseline.",
                "throughput", throughput_figures, True),
        section("memory", "Memory", "Peak memory of forward+backward and the decode state kept per sequence.",
                "memory", memory_figures, True),
        section("mqar", "Recall: MQAR", "Multi-query associative recall: accuracy against model width and "
                "against decode-state size.", "mqar", mqar_figures, False),
        section("niah", "Recall: needle in a haystack", "Accuracy by context length and needle depth; trained "
                "short, tested long.", "niah", niah_figures, False),
        section("fidelity", "Fidelity to softmax", "How closely the gate-free linear ops approximate causal "
                "softmax attention on the same q, k, v.", "fidelity", fidelity_figures, False, "lin_gdn,linear"),
    ]

    series = hist.build_series(ok, threshold)
    hist_html, hist_items = history_table(series) if series else ("", [])
    linked += hist_items
    sections.append(Section(
        "history", "History", f"Runs of the same key (task, mixer, config, seed, device) over time, by "
        f"<code>finished</code>. A run is flagged when its primary metric is worse than the median of the previous "
        f"{hist.WINDOW} runs by more than {threshold:.0%}.",
        hist.history_figures(series), html=hist_html,
        empty="No run key has two records yet: repeated (nightly) runs of the same config fill this.",
    ))
    for sec in sections:
        for fig in sec.figures:
            linked += fig.sources
    return sections, linked, series


def _header(results: Path, items: list[Item], banner: str) -> str:
    failed = sum(it.rec.status != "ok" for it in items)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f'<p class="meta">Built {now} from {len(items)} run record(s) ({len(items) - failed} ok, {failed} failed) '
            f"under <code>{escape(str(results))}</code>. Every number and every figure point links to the record it "
            f"came from; under each figure: device, versions and commit of its records.</p>{banner}")


def _copy_records(out: Path, linked: list[Item]) -> int:
    """Replace <out>/records with copies of the linked records; returns how many."""
    target = out / RECORDS_DIR
    if target.exists():
        shutil.rmtree(target)
    done = set()
    for it in linked:
        if it.href in done:
            continue
        dest = out / it.href
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(it.path, dest)
        done.add(it.href)
    return len(done)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".index.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a page is for reading
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def build_dashboard(results: Path, out: Path | None = None, threshold: float = DEFAULT_THRESHOLD) -> BuildResult:
    """Build <out>/index.html (out defaults to <results>/dashboard) from the records under `results`."""
    results = Path(results)
    out = Path(out) if out is not None else results / "dashboard"
    if out.resolve() in (results.resolve(), (results / "runs").resolve()):
        raise ValueError(f"--out must be a folder of its own, not the results dir or its runs/ ({out})")
    items = collect(results)
    warnings: list[str] = []
    sections, linked, series = build_sections(results, items, threshold, warnings)
    out.mkdir(parents=True, exist_ok=True)
    banner = regression_banner(series, threshold)
    html = render("Sequence-mixer dashboard", _header(results, items, banner), sections)
    copied = _copy_records(out, linked)
    page = out / PAGE
    _write_atomic(page, html)
    n_figures = sum(len(s.figures) for s in sections)
    regressions = sum(s.latest.regression for s in series)
    return BuildResult(page, len(items), copied, n_figures, regressions, tuple(warnings))
