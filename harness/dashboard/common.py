"""What every dashboard section shares: records paired with the link the page gives them,
grouping into comparable settings, provenance of a figure, Plotly layout helpers and
stable mixer colours."""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from harness.records import RunRecord
from tasks.base import Task
from tasks.registry import UnknownTaskError, get_task

RECORDS_DIR = "records"  # under --out: copies of the records the page links to


@dataclass(frozen=True)
class Item:
    """One run record, where it lies under the results dir, and its link from the page."""

    path: Path
    rec: RunRecord
    rel: str  # e.g. "runs/mqar/<run_id>.json", relative to the results dir

    @property
    def href(self) -> str:
        return f"{RECORDS_DIR}/{self.rel.removeprefix('runs/')}"


@dataclass
class Figure:
    """One Plotly figure: traces and layout as plain dicts, and the records it was drawn from."""

    fig_id: str
    title: str
    data: list[dict[str, Any]]
    layout: dict[str, Any]
    sources: list[Item] = field(default_factory=list)
    note: str = ""  # a line under the figure (what it shows, how to read it)

    def spec(self) -> dict[str, Any]:
        return {"id": self.fig_id, "data": self.data, "layout": self.layout}


@dataclass
class Section:
    """A part of the page: figures, extra HTML, or a "no records yet" line."""

    sec_id: str
    title: str
    intro: str
    figures: list[Figure] = field(default_factory=list)
    html: str = ""  # pre-rendered HTML (tables) placed before the figures
    empty: str = ""  # shown when the section has nothing: why, and the command that fills it


def task_meta(name: str) -> type[Task]:
    """The registered task class, or the base Task (default ranking) for an unknown name."""
    try:
        return get_task(name)
    except UnknownTaskError:
        return Task


def setting_key(rec: RunRecord) -> str:
    """The leaderboard's setting hash: runs with equal setting fields are comparable."""
    task = task_meta(rec.task)
    setting = {k: rec.config.get(k) for k in task.setting_fields}
    return hashlib.sha256(json.dumps(setting, sort_keys=True, default=str).encode()).hexdigest()[:8]


def group_by_setting(items: Iterable[Item], with_device: bool = True) -> list[tuple[tuple, list[Item]]]:
    """Items grouped by (preset, [device,] setting); groups comparing more mixers first, then by key."""
    groups: dict[tuple, list[Item]] = defaultdict(list)
    for it in items:
        key = (it.rec.preset, it.rec.device, setting_key(it.rec)) if with_device else (it.rec.preset, setting_key(it.rec))
        groups[key].append(it)
    return sorted(groups.items(), key=lambda kv: (-len({it.rec.mixer for it in kv[1]}), kv[0]))


def best_per_mixer(items: Iterable[Item], task: str) -> dict[str, Item]:
    """Each mixer's best ok record by its task's primary metric, mixers in name order: the run
    the leaderboard's row shows, so a figure drawn from it agrees with the table."""
    from tasks.registry import get_task

    meta = get_task(task)
    best: dict[str, Item] = {}
    for it in items:
        value = it.rec.metrics.get(meta.primary_metric)
        if it.rec.status != "ok" or value is None:
            continue
        cur = best.get(it.rec.mixer)
        old = None if cur is None else cur.rec.metrics[meta.primary_metric]
        if old is None or (value > old if meta.higher_is_better else value < old):
            best[it.rec.mixer] = it
    return dict(sorted(best.items()))


def short_commit(commit: str | None) -> str:
    if not commit:
        return "unknown"
    sha, dirty = commit.split("+", 1) if "+" in commit else (commit, "")
    return sha[:10] + ("+" + dirty if dirty else "")


def versions_text(versions: dict[str, str | None]) -> str:
    """'torch 2.11.0 · triton 3.6.0 · ...' from a record's versions, skipping absent ones."""
    order = ["torch", "triton", "cuda", "python", "harness", "flash_attn", "fla"]
    keys = [k for k in order if versions.get(k)] + sorted(k for k in versions if k not in order and versions.get(k))
    return " · ".join(f"{k} {versions[k]}" for k in keys)


def provenance(items: Iterable[Item]) -> dict[str, list[str]]:
    """Distinct devices, version sets and commits of the records behind a figure or table."""
    devices, versions, commits = {}, {}, {}
    for it in items:
        devices[it.rec.device] = None
        versions[versions_text(it.rec.versions)] = None
        commits[short_commit(it.rec.git_commit)] = None
    return {"devices": list(devices), "versions": list(versions), "commits": list(commits)}


_KNOWN_COLOURS = {
    "softmax": "#222222", "linear": "#1f77b4", "gla": "#2ca02c", "deltanet": "#ff7f0e",
    "gdn": "#d62728", "lin_gdn": "#9467bd", "mesa": "#8c564b",
}
_PALETTE = ["#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5"]


def colour(name: str) -> str:
    """A stable colour per mixer (or op) name, the same in every figure."""
    if name in _KNOWN_COLOURS:
        return _KNOWN_COLOURS[name]
    return _PALETTE[int(hashlib.md5(name.encode()).hexdigest(), 16) % len(_PALETTE)]


def axis(title: str, log: bool = False, **extra: Any) -> dict[str, Any]:
    """A Plotly axis. Log axes label every tick in full ("~g": 0.3, 0.4, ... where Plotly's own
    labels drop the leading "0."); pass tickformat="~s" for large counts (1M, 2M)."""
    out = {"title": {"text": title}, "type": "log" if log else "linear", "zeroline": False}
    if log:
        out.update(exponentformat="SI", tickformat="~g")
    out.update(extra)
    return out


def short_count(n: float) -> str:
    """512 -> '512', 2048 -> '2k', 65536 -> '64k', 1048576 -> '1M' (binary multiples)."""
    for size, suffix in ((2**20, "M"), (2**10, "k")):
        if n >= size and n % size == 0:
            return f"{int(n // size)}{suffix}"
    return f"{n:g}"


def length_axis(title: str, values: Iterable[float]) -> dict[str, Any]:
    """A log axis ticked at the lengths measured (at most ~10 ticks), labelled 512, 1k, 2k, ..."""
    ticks = sorted({float(v) for v in values if v and v > 0})
    step = max(1, math.ceil(len(ticks) / 10))
    ticks = ticks[::step]
    return axis(title, log=True, tickvals=ticks, ticktext=[short_count(t) for t in ticks])


def trace_xs(data: list[dict[str, Any]]) -> list[float]:
    """x values of the line traces (not of marker-only overlays such as crossovers)."""
    return [x for tr in data if str(tr.get("mode", "")).startswith("lines")
            for x in tr.get("x", []) if isinstance(x, (int, float))]


def layout(title: str, x: dict, y: dict, subtitle: str = "", **extra: Any) -> dict[str, Any]:
    """A Plotly layout with the page's common look; the subtitle goes on a second, smaller line."""
    text = title + (f"<br><span style='font-size:11.5px;color:#666'>{subtitle}</span>" if subtitle else "")
    return {
        "title": {"text": text, "font": {"size": 15}, "x": 0.01, "xanchor": "left"},
        "xaxis": x, "yaxis": y, "hovermode": "closest", "height": 420,
        "margin": {"l": 70, "r": 20, "t": 80, "b": 55}, "legend": {"orientation": "v"},
        "plot_bgcolor": "#fbfbfb", **extra,
    }


def view_menu(labels: list[str], visibility: list[list[bool]], active: int = 0) -> list[dict[str, Any]]:
    """A dropdown switching between views (sets of visible traces) of one figure."""
    buttons = [{"label": lab, "method": "restyle", "args": [{"visible": vis}]} for lab, vis in zip(labels, visibility)]
    # Above the legend, right of the plot area: clear of the left-aligned title.
    return [{"type": "dropdown", "buttons": buttons, "active": active, "x": 1.02, "xanchor": "left",
             "y": 1.02, "yanchor": "bottom", "showactive": True, "font": {"size": 11}}]


def loglog_interp(xs: list[float], ys: list[float], x: float) -> float | None:
    """y at x on the polyline through (xs, ys), linear in log-log space; None outside the data."""
    pts = sorted((a, b) for a, b in zip(xs, ys) if a and b and a > 0 and b > 0)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            if x1 == x0:
                return y0
            w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
    if pts and x == pts[0][0]:
        return pts[0][1]
    return None


def fmt_number(value: Any) -> str:
    """Compact text for a metric value in a table cell."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        v = float(value)
        if not math.isfinite(v):
            return str(v)
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3g}"
        if v == int(v) and abs(v) >= 10:
            return f"{int(v)}"
        return f"{v:.4f}" if abs(v) < 10 else f"{v:.1f}"
    return str(value)
