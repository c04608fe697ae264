"""PNG plots of the efficiency tasks, saved next to the run record.

Figures are built with matplotlib's object API on the Agg canvas (no pyplot, no display,
no global figure state), so plotting works headless and from several threads."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # harmless if already set; we never open a window
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

# Plain numbers on the log y axis, at 1, 2 and 5 per decade (readable on short ranges too).
_COMPACT = FuncFormatter(lambda y, _: f"{y:g}")

_PHASE_TITLES = {"fwd": "forward", "fwdbwd": "forward + backward", "decode": "one decode step"}
_BASELINE_STYLE = {"linestyle": ":", "linewidth": 1.0, "marker": ".", "alpha": 0.8}


def _loglog(ax: Axes, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs="auto"))
    ax.yaxis.set_major_formatter(_COMPACT)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: ""))
    ax.tick_params(labelsize=8)
    ax.grid(True, which="major", alpha=0.3)


def _line(ax: Axes, xs: list, ys: list, label: str, **style) -> bool:
    """Plot the finite (x, y) pairs; False when there were none."""
    pairs = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
    if not pairs:
        return False
    ax.plot([p[0] for p in pairs], [p[1] for p in pairs], label=label, **style)
    return True


def _mark_failed(ax: Axes, Ts: list, label: str) -> None:
    """Failed / out-of-memory points as red crosses along the top of the panel."""
    if Ts:
        ax.plot(Ts, [0.95] * len(Ts), "x", color="red", transform=ax.get_xaxis_transform(), label=label)


def _mark_crossover(ax: Axes, c: dict | None) -> None:
    if c and c.get("T"):
        where = "≤ " if c["kind"] == "below_grid" else "≈ "
        ax.axvline(c["T"], color="black", linestyle="--", linewidth=1, label=f"crossover T {where}{c['T']:.0f}")


def _save(fig: Figure, out_dir: Path, name: str) -> str:
    # Fixed margins in inches rather than tight_layout, which measures every label (slow).
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=0.85 / w, right=1 - 0.15 / w, bottom=0.55 / h, top=1 - 0.35 / h, wspace=0.3, hspace=0.45)
    fig.savefig(Path(out_dir) / name, dpi=100)
    return name


def _time_panel(ax: Axes, pts: list[dict], mixer: str, c: dict | None) -> None:
    Ts = [p["T"] for p in pts]
    _line(ax, Ts, [p.get("ms") for p in pts], mixer, marker="o")
    if mixer != "softmax":
        _line(ax, Ts, [p.get("softmax_ms") for p in pts], "softmax (same run)", marker="s", linestyle="--")
    names = sorted({n for p in pts for n in p.get("baselines", {})})
    for n in names:
        _line(ax, Ts, [p.get("baselines", {}).get(n, {}).get("ms") for p in pts], n, **_BASELINE_STYLE)
    _mark_failed(ax, [p["T"] for p in pts if p["status"] != "ok"], f"{mixer} failed/OOM")
    _mark_crossover(ax, c)
    if ax.lines:
        ax.legend(fontsize=6)


def plot_times(points: list[dict], crossovers: list[dict], out_dir: Path, mixer: str) -> list[str]:
    """Time vs T (log-log) per sweep: rows = modes, columns = fwd / fwd+bwd; returns file names."""
    files = []
    cross = {(c["mode"], c["sweep"], c["phase"]): c for c in crossovers}
    for sweep in ("budget", "fixed_batch"):
        pts = [p for p in points if p["sweep"] == sweep]
        if not pts:
            continue
        modes = [m for m in ("op", "layer") if any(p["mode"] == m for p in pts)]
        phases = [ph for ph in ("fwd", "fwdbwd") if any(p["phase"] == ph for p in pts)]
        fig = Figure(figsize=(5.2 * len(phases), 3.8 * len(modes)))
        axes = fig.subplots(len(modes), len(phases), squeeze=False)
        for i, mode in enumerate(modes):
            for j, phase in enumerate(phases):
                series = [p for p in pts if p["mode"] == mode and p["phase"] == phase]
                B = "B·T = const" if sweep == "budget" else f"B = {series[0]['B'] if series else '?'}"
                _loglog(axes[i][j], "T", "ms (median)", f"{mixer} · {mode} level · {_PHASE_TITLES[phase]} · {B}")
                _time_panel(axes[i][j], series, mixer, cross.get((mode, sweep, phase)))
        files.append(_save(fig, out_dir, f"time_vs_T_{sweep}.png"))
    return files


def plot_decode(points: list[dict], crossovers: list[dict], out_dir: Path, mixer: str) -> list[str]:
    """Decode-step latency vs context length, one panel per mode; returns file names."""
    pts = [p for p in points if p["phase"] == "decode"]
    if not pts:
        return []
    cross = {(c["mode"], c["sweep"], c["phase"]): c for c in crossovers}
    modes = [m for m in ("op", "layer") if any(p["mode"] == m for p in pts)]
    fig = Figure(figsize=(5.2 * len(modes), 3.8))
    axes = fig.subplots(1, len(modes), squeeze=False)[0]
    for ax, mode in zip(axes, modes):
        series = [p for p in pts if p["mode"] == mode]
        _loglog(ax, "context length", "ms per step (median)", f"{mixer} · {mode} level · decode, B = {series[0]['B']}")
        _time_panel(ax, series, mixer, cross.get((mode, "decode", "decode")))
    return [_save(fig, out_dir, "decode_latency_vs_context.png")]


def plot_memory(points: list[dict], out_dir: Path, mixer: str) -> list[str]:
    """Peak fwd+bwd memory (MiB above the inputs) vs T, one panel per mode, with the softmax
    baseline where measured; out-of-memory points are crosses. Returns file names."""
    if not points:
        return []
    modes = [m for m in ("op", "layer") if any(p["mode"] == m for p in points)]
    fig = Figure(figsize=(5.2 * len(modes), 3.8))
    axes = fig.subplots(1, len(modes), squeeze=False)[0]
    for ax, mode in zip(axes, modes):
        _loglog(ax, "T", "peak MiB above inputs", f"{mode} level · forward + backward, B = {points[0]['B']}")
        for who, style in ((mixer, {"marker": "o"}), ("softmax", {"marker": "s", "linestyle": "--"})):
            series = [p for p in points if p["mode"] == mode and p["model"] == who]
            if who == "softmax" and (mixer == "softmax" or not series):
                continue
            label = who if who == mixer else "softmax (same run)"
            _line(ax, [p["T"] for p in series], [p.get("peak_mib") for p in series], label, **style)
            _mark_failed(ax, [p["T"] for p in series if p["status"] != "ok"], f"{label}: OOM/failed")
        if ax.lines:
            ax.legend(fontsize=6)
    return [_save(fig, out_dir, "memory_vs_T.png")]


def plot_state_bytes(rows: list[dict], out_dir: Path, mixer: str) -> list[str]:
    """Decode-state bytes per sequence vs context length (mixer and softmax's KV cache)."""
    if not rows:
        return []
    fig = Figure(figsize=(5.2, 3.8))
    ax = fig.subplots()
    _loglog(ax, "context length", "bytes per sequence", f"{mixer} · decode state vs KV cache")
    Ts = [r["T"] for r in rows]
    _line(ax, Ts, [r["state_bytes"] for r in rows], mixer, marker="o")
    if mixer != "softmax":
        _line(ax, Ts, [r.get("softmax_state_bytes") for r in rows], "softmax KV cache", marker="s", linestyle="--")
    ax.legend(fontsize=6)
    return [_save(fig, out_dir, "decode_state_bytes.png")]
