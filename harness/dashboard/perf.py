"""Speed and memory figures from `throughput` and `memory` records: tokens/s vs T per mixer
(log-log) with the crossover against softmax marked, decode latency vs context length,
peak memory vs T and decode-state bytes vs context length.

Each record carries its own softmax baseline measured in the same process; the softmax
line is the softmax mixer's own record when the group has one, else the baseline of one
of the records (named so in the legend)."""

from __future__ import annotations

from typing import Any, Callable

from harness.dashboard.common import (
    Figure,
    Item,
    axis,
    best_per_mixer,
    colour,
    layout,
    length_axis,
    loglog_interp,
    trace_xs,
    view_menu,
)

PHASE_NAMES = {"fwd": "forward", "fwdbwd": "forward+backward", "decode": "decode step"}
SWEEP_NAMES = {"budget": "B·T fixed", "fixed_batch": "B fixed", "decode": ""}


def _shape_text(rec_items: list[Item]) -> str:
    shapes = rec_items[0].rec.details.get("shapes") or {}
    parts = [shapes.get("dtype"), f"H={shapes['num_heads']}" if "num_heads" in shapes else None,
             f"K=V={shapes['head_dim']}" if "head_dim" in shapes else None]
    return ", ".join(p for p in parts if p)


def _title(kind: str, key: tuple, items: list[Item]) -> tuple[str, str]:
    """(title, subtitle) of a figure of one (preset, device, setting) group."""
    preset, device, _ = key
    shape = _shape_text(items)
    return kind, f"{device} · preset {preset}" + (f" · {shape}" if shape else "") + " · best run per mixer, as in the table"


class _Traces:
    """Traces of a multi-view figure and, per view, which of them are visible."""

    def __init__(self) -> None:
        self.data: list[dict[str, Any]] = []
        self.view_of: list[int] = []

    def add(self, view: int, trace: dict[str, Any]) -> None:
        trace["visible"] = view == 0
        self.data.append(trace)
        self.view_of.append(view)

    def visibility(self, n_views: int) -> list[list[bool]]:
        return [[v == i for v in self.view_of] for i in range(n_views)]


def _line(name: str, xs: list, ys: list, custom: list, hover: str, *, dash: str | None = None,
          legend: str | None = None) -> dict[str, Any]:
    return {
        "type": "scatter", "mode": "lines+markers", "name": name, "x": xs, "y": ys, "customdata": custom,
        "line": {"color": colour(legend or name), "dash": dash or "solid"}, "marker": {"size": 6},
        "hovertemplate": f"<b>{name}</b><br>{hover}<extra></extra>",
    }


def _multi_view(fig_id: str, title: tuple[str, str], views: list[tuple[str, Callable[[_Traces, int], None]]],
                xtitle: str, ytitle: str, sources: list[Item], note: str) -> Figure | None:
    traces = _Traces()
    labels = []
    for label, fill in views:
        before = len(traces.data)
        fill(traces, len(labels))
        if len(traces.data) > before:
            labels.append(label)
        else:  # a view without data: drop it
            del traces.data[before:], traces.view_of[before:]
    if not traces.data:
        return None
    # times read best as plain numbers (0.5 ms), counts with SI prefixes (2M tokens/s, 64k bytes)
    yformat = "~g" if ytitle.startswith("ms") else "~s"
    lay = layout(title[0], length_axis(xtitle, trace_xs(traces.data)), axis(ytitle, log=True, tickformat=yformat),
                 subtitle=title[1])
    if len(labels) > 1:
        lay["updatemenus"] = view_menu(labels, traces.visibility(len(labels)))
    return Figure(fig_id, f"{title[0]} · {title[1]}", traces.data, lay, sources, note)


def _ok(points: list[dict], **match: Any) -> list[dict]:
    return sorted((p for p in points if p.get("status") == "ok" and all(p.get(k) == v for k, v in match.items())),
                  key=lambda p: p["T"])


def _crossover_text(c: dict) -> str:
    """'T ≈ 6.6k', or 'T ≤ 512' when already faster at the smallest T measured."""
    T = c["T"]
    length = f"{T / 1000:.1f}k" if T >= 1000 else f"{T:.0f}"
    return f"T {'≤' if c.get('kind') == 'below_grid' else '≈'} {length}"


def _crossover_mark(mixer: str, it: Item, c: dict, y: float) -> dict[str, Any]:
    """A × on the mixer's curve where it becomes faster than softmax; its legend entry is the mixer's."""
    text = f"{mixer} crossover: {_crossover_text(c)}"
    return {
        "type": "scatter", "mode": "markers", "name": text, "legendgroup": mixer, "showlegend": False,
        "x": [c["T"]], "y": [y], "customdata": [[it.href]],
        "marker": {"symbol": "x-thin-open", "size": 16, "color": colour(mixer), "line": {"width": 3, "color": colour(mixer)}},
        "hovertemplate": f"{text}: faster than softmax from here on<extra></extra>",
    }


def _speed_views(latest: dict[str, Item], phases: list[str], y_key: str, y_from_ms: Callable[[dict, float], float],
                 hover: str) -> list[tuple[str, Callable[[_Traces, int], None]]]:
    """One view per (mode, sweep, phase) present in the records, mixer lines + softmax + crossovers."""
    combos = []
    for it in latest.values():
        for p in it.rec.details.get("points", []):
            c = (p.get("mode"), p.get("sweep"), p.get("phase"))
            if c[2] in phases and c not in combos:
                combos.append(c)
    combos.sort(key=lambda c: (c[0] != "layer", c[1] != "budget", c[1], phases.index(c[2])))

    def fill_for(mode: str, sweep: str, phase: str) -> Callable[[_Traces, int], None]:
        def fill(traces: _Traces, view: int) -> None:
            for mixer, it in latest.items():
                pts = _ok(it.rec.details.get("points", []), mode=mode, sweep=sweep, phase=phase)
                if not pts:
                    continue
                xs, ys = [p["T"] for p in pts], [p[y_key] for p in pts]
                custom = [[it.href, p["ms"], p.get("B")] for p in pts]
                marks = [(c, loglog_interp(xs, ys, c["T"])) for c in it.rec.details.get("crossovers", [])
                         if (c.get("mode"), c.get("sweep"), c.get("phase")) == (mode, sweep, phase) and c.get("T")]
                marks = [(c, y) for c, y in marks if y is not None]
                name = f"{mixer} (× {_crossover_text(marks[0][0])})" if marks else mixer
                traces.add(view, {**_line(name, xs, ys, custom, hover, legend=mixer), "legendgroup": mixer})
                for c, y in marks:
                    traces.add(view, _crossover_mark(mixer, it, c, y))
            if "softmax" not in latest and latest:
                it = next(iter(latest.values()))
                pts = [p for p in _ok(it.rec.details.get("points", []), mode=mode, sweep=sweep, phase=phase)
                       if p.get("softmax_ms")]
                if pts:
                    name = f"softmax (baseline in the {it.rec.mixer} run)"
                    traces.add(view, _line(name, [p["T"] for p in pts], [y_from_ms(p, p["softmax_ms"]) for p in pts],
                                           [[it.href, p["softmax_ms"], p.get("B")] for p in pts], hover,
                                           dash="dash", legend="softmax"))
        return fill

    label = lambda m, s, ph: " · ".join(x for x in (m, PHASE_NAMES.get(ph, ph), SWEEP_NAMES.get(s, s)) if x)  # noqa: E731
    return [(label(*c), fill_for(*c)) for c in combos]


def throughput_figures(groups: list[tuple[tuple, list[Item]]]) -> list[Figure]:
    """Per (preset, device, setting): tokens/s vs T; and decode latency vs context length."""
    figures = []
    for n, (key, items) in enumerate(groups):
        latest = best_per_mixer(items, "throughput")
        sources = list(latest.values())
        tokens_per_s = lambda p, ms: p["tokens"] / (ms / 1e3)  # noqa: E731
        views = _speed_views(latest, ["fwdbwd", "fwd"], "tokens_per_s", tokens_per_s,
                             "T=%{x:,}<br>%{y:.3s} tokens/s<br>%{customdata[1]:.3g} ms, B=%{customdata[2]}")
        fig = _multi_view(f"throughput-{n}", _title("Throughput vs T", key, items), views, "sequence length T",
                          "tokens / s", sources,
                          "Layer or op level, forward or forward+backward (menu, top right). × marks the crossover: "
                          "the T from which the mixer is faster than softmax attention, measured in the same run.")
        if fig:
            figures.append(fig)
        decode = _speed_views(latest, ["decode"], "ms", lambda p, ms: ms,
                              "context T=%{x:,}<br>%{y:.3g} ms per step<br>B=%{customdata[2]}")
        fig = _multi_view(f"decode-{n}", _title("Decode latency vs context length", key, items), decode,
                          "context length T", "ms per decode step", sources,
                          "Time of one decode step after T tokens of context (lower is better).")
        if fig:
            figures.append(fig)
    return figures


def memory_figures(groups: list[tuple[tuple, list[Item]]]) -> list[Figure]:
    """Per (preset, device, setting): peak fwd+bwd memory vs T; decode-state bytes vs context."""
    figures = []
    for n, (key, items) in enumerate(groups):
        latest = best_per_mixer(items, "memory")
        sources = list(latest.values())
        modes = sorted({p.get("mode") for it in sources for p in it.rec.details.get("points", [])},
                       key=lambda m: (m != "layer", str(m)))
        views = [(f"{m} level", _memory_view(latest, m)) for m in modes]
        fig = _multi_view(f"memory-{n}", _title("Peak memory of forward+backward vs T", key, items), views,
                          "sequence length T", "peak MiB above the inputs", sources,
                          "Legend names say where a series ran out of memory.")
        if fig:
            figures.append(fig)
        fig = _multi_view(f"state-{n}", _title("Decode state per sequence vs context length", key, items),
                          [("state", _state_view(latest))], "context length T", "bytes per sequence", sources,
                          "Softmax's KV cache grows with T; a recurrent state does not.")
        if fig:
            figures.append(fig)
    return figures


def _oom_suffix(points: list[dict], model: str, mode: str) -> str:
    ooms = [p["T"] for p in points if p.get("model") == model and p.get("mode") == mode and p.get("status") == "oom"]
    return f" (out of memory at T={min(ooms):,})" if ooms else ""


def _memory_view(latest: dict[str, Item], mode: str) -> Callable[[_Traces, int], None]:
    hover = "T=%{x:,}<br>%{y:.4g} MiB"

    def fill(traces: _Traces, view: int) -> None:
        for mixer, it in latest.items():
            points = it.rec.details.get("points", [])
            pts = _ok(points, model=mixer, mode=mode)
            if pts:
                traces.add(view, _line(mixer + _oom_suffix(points, mixer, mode), [p["T"] for p in pts],
                                       [p["peak_mib"] for p in pts], [[it.href] for p in pts], hover, legend=mixer))
        if "softmax" not in latest:
            for it in latest.values():
                points = it.rec.details.get("points", [])
                pts = _ok(points, model="softmax", mode=mode)
                if pts:
                    name = f"softmax (baseline in the {it.rec.mixer} run)" + _oom_suffix(points, "softmax", mode)
                    traces.add(view, _line(name, [p["T"] for p in pts], [p["peak_mib"] for p in pts],
                                           [[it.href] for p in pts], hover, dash="dash", legend="softmax"))
                    break
    return fill


def _state_view(latest: dict[str, Item]) -> Callable[[_Traces, int], None]:
    hover = "T=%{x:,}<br>%{y:.4s}B per sequence"

    def fill(traces: _Traces, view: int) -> None:
        for mixer, it in latest.items():
            rows = [r for r in it.rec.details.get("decode_state", []) if r.get("state_bytes")]
            if rows:
                traces.add(view, _line(mixer, [r["T"] for r in rows], [r["state_bytes"] for r in rows],
                                       [[it.href] for _ in rows], hover))
        if "softmax" not in latest:
            for it in latest.values():
                rows = [r for r in it.rec.details.get("decode_state", []) if r.get("softmax_state_bytes")]
                if rows:
                    traces.add(view, _line(f"softmax (baseline in the {it.rec.mixer} run)", [r["T"] for r in rows],
                                           [r["softmax_state_bytes"] for r in rows], [[it.href] for _ in rows], hover,
                                           dash="dash", legend="softmax"))
                    break
    return fill
