"""History across nightly runs: the records of one run key (task, mixer, preset, device and
config hash: the same resolved config and seed) ordered by `finished`, with regressions
flagged on the task's primary metric.

A point is a regression when it is worse than the median of up to `window` earlier points
of its series by more than `threshold` (relative), in the direction that is worse for that
metric (a drop when higher is better, a rise when lower is better)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone

from harness.dashboard.common import Figure, Item, axis, colour, layout, task_meta

WINDOW = 5


@dataclass
class Point:
    item: Item
    value: float
    baseline: float | None = None  # median of the previous points (None for the first)
    change: float | None = None  # (value - baseline) / |baseline|
    regression: bool = False


@dataclass
class Series:
    task: str
    mixer: str
    preset: str
    device: str
    config_hash: str
    metric: str
    higher_is_better: bool
    points: list[Point] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.mixer} · {self.device} · {self.preset} · config {self.config_hash[:6]}"

    @property
    def latest(self) -> Point:
        return self.points[-1]


def plot_time(stamp: str) -> str:
    """A record's ISO timestamp as UTC 'YYYY-MM-DD HH:MM:SS' (Plotly's date axes ignore offsets)."""
    try:
        t = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc).replace(tzinfo=None)
    return t.strftime("%Y-%m-%d %H:%M:%S")


def build_series(items: list[Item], threshold: float, window: int = WINDOW) -> list[Series]:
    """Every run key with at least two ok records holding the primary metric, regressions flagged."""
    if threshold <= 0:
        raise ValueError(f"regression threshold must be > 0 (a relative change, e.g. 0.1 = 10%), got {threshold}")
    keyed: dict[tuple, list[Item]] = defaultdict(list)
    for it in items:
        r = it.rec
        keyed[(r.task, r.mixer, r.preset, r.device, r.config_hash)].append(it)
    out = []
    for (task, mixer, preset, device, chash), group in sorted(keyed.items()):
        meta = task_meta(task)
        metric = meta.primary_metric
        group = sorted((it for it in group if metric in it.rec.metrics), key=lambda it: it.rec.finished)
        if len(group) < 2:
            continue
        s = Series(task, mixer, preset, device, chash, metric, meta.higher_is_better)
        for i, it in enumerate(group):
            p = Point(it, float(it.rec.metrics[metric]))
            earlier = [q.value for q in s.points[max(0, i - window):i]]
            if earlier:
                p.baseline = statistics.median(earlier)
                if p.baseline != 0:
                    p.change = (p.value - p.baseline) / abs(p.baseline)
                    worse = -p.change if s.higher_is_better else p.change
                    p.regression = worse > threshold
            s.points.append(p)
        out.append(s)
    return out


def history_figures(series: list[Series]) -> list[Figure]:
    """One figure per task: the primary metric of each series over time, regressions marked."""
    by_task: dict[str, list[Series]] = defaultdict(list)
    for s in series:
        by_task[s.task].append(s)
    figures = []
    for task, group in sorted(by_task.items()):
        data, bad = [], {"x": [], "y": [], "text": [], "customdata": []}
        values = [p.value for s in group for p in s.points]
        for s in group:
            data.append({
                "type": "scatter", "mode": "lines+markers", "name": s.label,
                "x": [plot_time(p.item.rec.finished) for p in s.points], "y": [p.value for p in s.points],
                "customdata": [[p.item.href, p.item.rec.run_id] for p in s.points],
                "line": {"color": colour(s.mixer)},
                "hovertemplate": f"<b>{s.label}</b><br>%{{x}}<br>{s.metric} %{{y:.4g}}<br>%{{customdata[1]}}<extra></extra>",
            })
            for p in s.points:
                if p.regression:
                    bad["x"].append(plot_time(p.item.rec.finished)), bad["y"].append(p.value)
                    bad["text"].append(f"{s.label}: {p.change:+.1%} vs median of the previous runs")
                    bad["customdata"].append([p.item.href])
        if bad["x"]:
            data.append({"type": "scatter", "mode": "markers", "name": "regression", **bad,
                         "marker": {"symbol": "x", "size": 14, "color": "#d00", "line": {"width": 2}},
                         "hovertemplate": "%{text}<extra>regression</extra>"})
        metric, better = group[0].metric, "higher" if group[0].higher_is_better else "lower"
        positive = [v for v in values if v > 0]
        log_y = len(positive) == len(values) and max(positive) / min(positive) > 100
        title = f"{task}: {metric} over time"
        lay = layout(title, axis("finished", type="date"), axis(metric, log=log_y), subtitle=f"{better} is better",
                     legend={"orientation": "h", "y": -0.25})
        figures.append(Figure(f"history-{task}", title, data, lay, [p.item for s in group for p in s.points],
                              "One line per run key (same config and seed, same device). × = regression."))
    return figures
